package dbusapi

import (
	"testing"
	"time"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// TestSetGPUInstanceSchedulerOverDBus: the per-GPU-instance scheduler pin
// through the client, shown by the GPU's GPUInstanceSchedulers property;
// a GPU without such schedulers and a GPU instance the GPU lacks are
// refused by name.
func TestSetGPUInstanceSchedulerOverDBus(t *testing.T) {
	spec := &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{
		{Model: "RTX-PRO-6000-BSE-96GB", PCI: hostileRTXPro, Flavour: "vfio", MIG: true},
		{Model: "H100-SXM5-80GB", PCI: sim.DefaultH100MIG, Flavour: "vfio", MIG: true},
	}}
	e := newEnvOn(t, spec, testbus.Options{}, nil)
	ctx := ctxT(t)
	e.tenant("acme", unlimitedQuota())
	in, err := e.m.Instance(e.create("acme", "RTX Pro 6000 Blackwell DC-1-6Q", hostileRTXPro).UUID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.SetGPUInstanceScheduler(ctx, sim.DefaultH100MIG, 0, "", "equal_share", 0); ErrorName(err) != NameInvalidArgument {
		t.Errorf("Hopper: %v, want InvalidArgument", err)
	}
	if _, err := e.client.SetGPUInstanceScheduler(ctx, hostileRTXPro, in.GIID+7, "", "equal_share", 0); ErrorName(err) != NameNotFound {
		t.Errorf("no such GPU instance: %v, want NotFound", err)
	}
	r, err := e.client.SetGPUInstanceScheduler(ctx, hostileRTXPro, in.GIID, "", "equal_share", 5*time.Millisecond)
	if err != nil || r.Mode != "pinned" || r.Pending {
		t.Fatalf("pin: %+v, %v", r, err)
	}
	g, err := e.client.GPU(ctx, hostileRTXPro)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.GPUInstanceSchedulers) != 1 {
		t.Fatalf("GPUInstanceSchedulers = %+v, want the one GPU instance", g.GPUInstanceSchedulers)
	}
	s := g.GPUInstanceSchedulers[0]
	if s.GPUInstance != in.GIID || s.Profile != "1g.24gb+gfx" || s.Mode != "pinned" || s.Policy != "equal_share" || s.Timeslice != 5*time.Millisecond || s.Pending {
		t.Fatalf("GPU instance scheduler shown as %+v", s)
	}
	if h, _ := e.client.GPU(ctx, sim.DefaultH100MIG); len(h.GPUInstanceSchedulers) != 0 {
		t.Fatalf("Hopper shows GPU instance schedulers: %+v", h.GPUInstanceSchedulers)
	}
}
