package manager_test

import (
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
)

// scaleSpec is a host with one GPU of each kind of room: MIG GPU
// instances, GPU instances shared by several vGPUs, time-sliced vGPUs on
// VFs and on mdev parents, and a GPU in heterogeneous mode.
func scaleSpec() *sim.Spec {
	return &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{
		{Model: "H100-SXM5-80GB", PCI: "0000:11:00.0", Flavour: gpu.FlavourVFIO, MIG: true},
		{Model: "H200-SXM5-141GB", PCI: "0000:31:00.0", Flavour: gpu.FlavourVFIO},
		{Model: "RTX-PRO-6000-BSE-96GB", PCI: "0000:41:00.0", Flavour: gpu.FlavourVFIO, MIG: true},
		{Model: "H100-SXM5-80GB", PCI: "0000:51:00.0", Flavour: gpu.FlavourVFIO, Heterogeneous: true},
		{Model: "A10-24GB", PCI: "0000:71:00.0", Flavour: gpu.FlavourMdev},
		{Model: "L40S-48GB", PCI: "0000:81:00.0", Flavour: gpu.FlavourMdev},
	}}
}

// roomIsOneNumber checks, for every profile on every GPU of the host, that
// the capacity query, the fleet view and the admission give one number:
// capacity's count per model is the sum of the rooms the fleet view
// publishes on that model's GPUs, and each published room is what creates
// pinned to the GPU take before the first refusal.
func (e *env) roomIsOneNumber(layout string) {
	e.t.Helper()
	caps, err := e.m.Capacity()
	if err != nil {
		e.t.Fatal(err)
	}
	view, err := e.m.FleetView()
	if err != nil {
		e.t.Fatal(err)
	}
	type key struct{ model, kind, profile string }
	published := map[key]int{}
	for _, g := range view {
		for _, c := range g.Classes {
			published[key{g.Model, string(c.Kind), c.Profile}] += c.Room
		}
	}
	counted := map[key]bool{}
	for _, c := range caps {
		k := key{c.Model, c.Kind, c.Profile}
		counted[k] = true
		if n := published[k]; n != c.Count {
			e.t.Errorf("%s: capacity of %s %s on %s is %d; the fleet view publishes room %d", layout, c.Kind, c.Profile, c.Model, c.Count, n)
		}
	}
	for k, n := range published {
		if !counted[k] && n > 0 {
			e.t.Errorf("%s: the fleet view publishes room %d for %s %s on %s; capacity has no row for it", layout, n, k.kind, k.profile, k.model)
		}
	}
	if e.t.Failed() {
		e.t.FailNow()
	}
	for _, g := range view {
		e.roomIsAdmission(g.PCI)
	}
}

// TestRoomIsOneNumber: `vgpuctl capacity`, what Placement is told and
// what the admission takes agree for every profile on every GPU of the
// default host and of a host with one GPU of each kind, fresh and with a
// mix of instances carved.
func TestRoomIsOneNumber(t *testing.T) {
	t.Run("default", func(t *testing.T) {
		e := newEnv(t, nil)
		e.tenant("acme", unlimited())
		e.roomIsOneNumber("fresh")
		e.mustCreate("acme", "3g.40gb", sim.DefaultH100MIG)
		e.mustCreate("acme", "H100XM-1-10C", sim.DefaultH100MIG)
		e.mustCreate("acme", "H100XM-8C", sim.DefaultH100TS)
		e.mustCreate("acme", "L4-4Q", sim.DefaultL4)
		e.mustCreate("acme", manager.ProfilePassthrough, sim.DefaultA10)
		e.roomIsOneNumber("mixed")
	})
	t.Run("scale", func(t *testing.T) {
		e := newEnv(t, scaleSpec())
		e.tenant("acme", unlimited())
		e.roomIsOneNumber("fresh")
		e.mustCreate("acme", "2g.20gb", "0000:11:00.0")
		e.mustCreate("acme", "H200X-4C", "0000:31:00.0")
		e.mustCreate("acme", "RTX Pro 6000 Blackwell DC-1-6Q", "0000:41:00.0")
		e.mustCreate("acme", "RTX Pro 6000 Blackwell DC-2-16Q", "0000:41:00.0")
		e.mustCreate("acme", "H100XM-20C", "0000:51:00.0")
		e.mustCreate("acme", "H100XM-10C", "0000:51:00.0")
		e.mustCreate("acme", "A10-1Q", "0000:71:00.0")
		e.mustCreate("acme", "L40S-2Q", "0000:81:00.0")
		e.roomIsOneNumber("mixed")
	})
}
