package fleet

import (
	"context"
	"testing"

	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/profiles"
)

// unitsAt is the GPU at pci of h in Placement's units.
func unitsAt(t *testing.T, h *simhost.Host, pci string) gpuUnits {
	t.Helper()
	view, err := h.Manager.FleetView()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range view {
		if g.PCI == pci {
			return unitsOf(g, nil)
		}
	}
	t.Fatalf("no GPU %s in the fleet view", pci)
	return gpuUnits{}
}

func unitClassOf(g gpuUnits, profile string) (unitClass, bool) {
	for _, c := range g.Classes {
		if c.Profile == profile {
			return c, true
		}
	}
	return unitClass{}, false
}

func mustCreate(t *testing.T, h *simhost.Host, profile, pci string) store.Instance {
	t.Helper()
	r, err := h.Manager.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: profile, GPU: pci})
	if err != nil {
		t.Fatalf("create %s on %s: %v", profile, pci, err)
	}
	return r
}

// TestFleetUnitsOfMIGBackedAndPassthrough: a MIG-backed vGPU alone in its
// GPU instance claims that instance's slots, a whole GPU every slot of a
// MIG GPU and all the framebuffer of a time-sliced one.
func TestFleetUnitsOfMIGBackedAndPassthrough(t *testing.T) {
	h := simhost.Start(t, simhost.Options{})
	simhost.DefineTenant(t, h.Manager, "acme")

	g := unitsAt(t, h, sim.DefaultH100MIG)
	want := map[string]unitClass{
		"H100XM-3-40C":             {Profile: "H100XM-3-40C", Kind: store.KindMIGVGPU, Slices: 4, Room: 2},
		"H100XM-1-10C":             {Profile: "H100XM-1-10C", Kind: store.KindMIGVGPU, Slices: 1, Room: 7},
		manager.ProfilePassthrough: {Profile: manager.ProfilePassthrough, Kind: store.KindPassthrough, Slices: 8, Room: 1},
	}
	for name, w := range want {
		if c, ok := unitClassOf(g, name); !ok || c != w {
			t.Fatalf("class %s = %+v (published %v), want %+v", name, c, ok, w)
		}
	}
	v := mustCreate(t, h, "H100XM-3-40C", sim.DefaultH100MIG)
	g = unitsAt(t, h, sim.DefaultH100MIG)
	if len(g.Instances) != 1 || g.Instances[0] != (unitClaim{Instance: v.UUID, GPU: v.GPUUUID, Profile: "H100XM-3-40C", Kind: store.KindMIGVGPU, Slices: 4}) {
		t.Fatalf("published instances %+v, want the MIG-backed vGPU with its 4 slots", g.Instances)
	}
	if g.Unclaimable != 0 {
		t.Fatalf("unclaimable slots %d, want 0: the vGPU's allocation holds its slots", g.Unclaimable)
	}
	if err := h.Manager.Destroy(context.Background(), v.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	w := mustCreate(t, h, manager.ProfilePassthrough, sim.DefaultH100MIG)
	g = unitsAt(t, h, sim.DefaultH100MIG)
	if g.State != gpu.StatePassthrough || len(g.Instances) != 1 || g.Instances[0].Slices != 8 || g.Instances[0].Instance != w.UUID {
		t.Fatalf("whole GPU: state %s, instances %+v; want its claim of all 8 slots", g.State, g.Instances)
	}
	// On a time-sliced GPU the whole GPU takes no slots but all the
	// framebuffer its vGPUs share.
	a := mustCreate(t, h, manager.ProfilePassthrough, sim.DefaultA10)
	g = unitsAt(t, h, sim.DefaultA10)
	if len(g.Instances) != 1 || g.FramebufferMiB == 0 || g.Instances[0] != (unitClaim{Instance: a.UUID, GPU: a.GPUUUID, Profile: manager.ProfilePassthrough, Kind: store.KindPassthrough, FramebufferMiB: g.FramebufferMiB}) {
		t.Fatalf("whole A10: shared framebuffer %d, instances %+v", g.FramebufferMiB, g.Instances)
	}
}

// TestFleetUnitsOfSharedGPUInstances: types whose vGPUs share a GPU
// instance claim no slots (one instance's slots cannot be split among its
// vGPUs in whole units); the GPU instance's slots are unclaimable once.
func TestFleetUnitsOfSharedGPUInstances(t *testing.T) {
	const pci = "0000:41:00.0"
	h := simhost.Start(t, simhost.Options{Spec: &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{{Model: "RTX-PRO-6000-BSE-96GB", PCI: pci, Flavour: gpu.FlavourVFIO, MIG: true}}}})
	simhost.DefineTenant(t, h.Manager, "acme")
	const typ = "RTX Pro 6000 Blackwell DC-1-6Q" // four per 1g.24gb+gfx (3 slots)
	before, ok := unitClassOf(unitsAt(t, h, pci), typ)
	if !ok || before.Slices != 0 || before.Kind != store.KindMIGVGPU || before.Room == 0 {
		t.Fatalf("class %s = %+v (published %v)", typ, before, ok)
	}
	v := mustCreate(t, h, typ, pci)
	g := unitsAt(t, h, pci)
	if len(g.Instances) != 1 || g.Instances[0].Slices != 0 || g.Instances[0].Instance != v.UUID {
		t.Fatalf("published instances %+v, want the vGPU with no slots", g.Instances)
	}
	if g.Unclaimable != 3 {
		t.Fatalf("unclaimable slots %d, want the shared GPU instance's 3", g.Unclaimable)
	}
}

// TestFleetUnitsOfComputeInstances: compute instances narrower than their
// GPU instance are not published as allocations; their GPU instance's
// slots are unclaimable once, however many compute instances share it.
func TestFleetUnitsOfComputeInstances(t *testing.T) {
	h := simhost.Start(t, simhost.Options{})
	simhost.DefineTenant(t, h.Manager, "acme")
	for i := 0; i < 3; i++ {
		mustCreate(t, h, "1c.3g.40gb", sim.DefaultH100MIG)
	}
	whole := mustCreate(t, h, "1g.10gb", sim.DefaultH100MIG)
	g := unitsAt(t, h, sim.DefaultH100MIG)
	if len(g.Instances) != 1 || g.Instances[0].Instance != whole.UUID || g.Instances[0].Slices != 1 {
		t.Fatalf("published instances %+v, want only the 1g.10gb", g.Instances)
	}
	if g.Unclaimable != 4 {
		t.Fatalf("unclaimable slots %d, want the 3g.40gb's 4 once", g.Unclaimable)
	}
}

// TestGPUUnitsHoldTheCatalog: the GPU class's total is at least the most
// instances any GPU of the catalog holds, so its unit per instance never
// refuses what the GPU's own room takes.
func TestGPUUnitsHoldTheCatalog(t *testing.T) {
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	most, which := 0, ""
	for _, md := range cat.Models() {
		if n := md.MostInstances(); n > most {
			most, which = n, md.Name
		}
	}
	if most > GPUUnits || most < 16 {
		t.Fatalf("the catalog's fullest GPU (%s) holds up to %d instances; GPUClass's total is %d", which, most, GPUUnits)
	}
	t.Logf("fullest GPU of the catalog: %s, up to %d instances; GPUClass total %d", which, most, GPUUnits)
}
