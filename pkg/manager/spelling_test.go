package manager_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// Create records one spelling per compute-instance profile, nvidia-smi's,
// whatever the caller typed ("01c.3g.40gb", "3c.3g.40gb" for the one as
// wide as its GPU instance), keeping the model qualifier; a retry with the
// same UUID in another spelling is the same request.
func TestCreateRecordsCanonicalComputeInstanceNames(t *testing.T) {
	// Two MIG H100s: room for every spelling below.
	e := newEnv(t, &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{
		{Model: "H100-SXM5-80GB", PCI: sim.DefaultH100MIG, Flavour: gpu.FlavourVFIO, MIG: true},
		{Model: "H100-SXM5-80GB", PCI: "0000:42:00.0", Flavour: gpu.FlavourVFIO, MIG: true},
	}})
	e.tenant("acme", unlimited())
	e.tenant("beta", unlimited())
	for _, c := range []struct{ tenant, typed, want string }{
		{"acme", "01c.3g.40gb", "1c.3g.40gb"},
		{"acme", "0001c.3g.40gb", "1c.3g.40gb"},
		{"acme", "H100-SXM5-80GB/01c.3g.40gb", "H100-SXM5-80GB/1c.3g.40gb"},
		{"beta", "3c.3g.40gb", "3g.40gb"},
		{"beta", "H100-03c.3g.40gb", "H100-3g.40gb"},
		{"acme", "1c.1g.10gb", "1g.10gb"},
		{"acme", "MIG 1c.2g.20gb", "1c.2g.20gb"},
	} {
		rec, err := e.create(c.tenant, c.typed, "")
		if err != nil {
			t.Fatalf("create %s: %v", c.typed, err)
		}
		if rec.Profile != c.want {
			t.Errorf("create %s recorded %q, want %q", c.typed, rec.Profile, c.want)
		}
		got, err := e.m.Instance(rec.UUID)
		if err != nil || got.Profile != c.want {
			t.Errorf("instance %s reads %q (%v), want %q", rec.UUID, got.Profile, err, c.want)
		}
	}
	ctx := context.Background()
	first, err := e.m.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "1c.2g.20gb", UUID: "0b5e5b8e-4c1f-4b65-9a53-3a8c1a0e6d01"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.m.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "01c.2g.20gb", UUID: first.UUID})
	if err != nil || again.UUID != first.UUID {
		t.Fatalf("retry in another spelling: %+v, %v", again, err)
	}
}

// Records an older vgpud stored as typed are rewritten to the canonical
// spelling by reconcile, keeping the instance (UUID, placement) as it is.
func TestReconcileRewritesOldProfileSpellings(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	one := e.mustCreate("acme", "1c.3g.40gb", sim.DefaultH100MIG)
	whole := e.mustCreate("acme", "H100-SXM5-80GB/3g.40gb", sim.DefaultH100MIG)
	vgpu := e.mustCreate("acme", "H100XM-10C", sim.DefaultH100TS)
	old := map[string]string{one.UUID: "001c.3g.40gb", whole.UUID: "H100-SXM5-80GB/3c.3g.40gb", vgpu.UUID: "H100XM-10C"}
	if err := e.host.DB.Update(func(tx *store.Tx) error {
		for id, p := range old {
			r, err := tx.Instance(id)
			if err != nil {
				return err
			}
			r.Profile = p
			if err := tx.PutInstance(&r); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	before := e.summary()
	if _, err := e.m.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{one.UUID: "1c.3g.40gb", whole.UUID: "H100-SXM5-80GB/3g.40gb", vgpu.UUID: "H100XM-10C"}
	insts, err := e.m.AllInstances()
	if err != nil || len(insts) != 3 {
		t.Fatalf("instances %d, %v", len(insts), err)
	}
	for _, in := range insts {
		if in.Profile != want[in.UUID] || in.State != store.StateReady {
			t.Errorf("instance %s: %q %s, want %q ready", in.UUID, in.Profile, in.State, want[in.UUID])
		}
	}
	if after := e.summary(); after != before {
		t.Fatalf("reconcile changed the host:\n%s\n%s", before, after)
	}
}

// A whole GPU with MIG on and a GPU instance vgpud did not create: turning
// MIG off is refused naming that GPU instance, not a VM.
func TestMIGOffRefusedForForeignGPUInstance(t *testing.T) {
	e := newEnv(t, nil)
	lib := e.sim.NVML()
	lib.Init()
	dev, _ := lib.DeviceGetHandleByPciBusId(sim.DefaultH100MIG)
	info, _ := dev.GetGpuInstanceProfileInfo(0) // 1g.10gb
	if _, r := dev.CreateGpuInstance(&info); r != 0 {
		t.Fatalf("foreign GI: %v", r)
	}
	ctx := context.Background()
	if err := e.m.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	before := e.summary()
	err := e.m.SetMIGMode(ctx, sim.DefaultH100MIG, false)
	if !errors.Is(err, manager.ErrBusy) || strings.Contains(err.Error(), "VM") || !strings.Contains(err.Error(), "did not create") {
		t.Fatalf("MIG off with a foreign GPU instance: %v", err)
	}
	if e.summary() != before {
		t.Fatal("the refusal changed the host")
	}
}
