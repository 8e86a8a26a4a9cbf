package fleet

import (
	"context"
	"testing"

	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
)

// placementRoom is how many more instances of class c Placement itself
// would accept on p: the fewest, over the resources one instance takes
// (its class, slices, framebuffer), of the capacity left (total less
// reserved less what p's allocations hold) divided by what it takes.
func placementRoom(p *gpuProvider, c unitClass) int {
	used := map[string]int{}
	for _, r := range p.allocs {
		for rc, n := range r {
			used[rc] += n
		}
	}
	need := resourcesOf(unitClaim{Kind: c.Kind, Profile: c.Profile, Slices: c.Slices, FramebufferMiB: c.FramebufferMiB})
	most := -1
	for rc, n := range need {
		inv := p.inv[rc]
		k := max(0, inv.Total-inv.Reserved-used[rc]) / n
		if most < 0 || k < most {
			most = k
		}
	}
	return most
}

// TestPlacementCountsTheRoom: for every class of every GPU, what
// Placement would accept given the inventories the syncer publishes is
// the room the fleet view gives, and per model the capacity query's
// count; on the default host and a host with one GPU of each kind, fresh
// and with a mix of instances carved.
func TestPlacementCountsTheRoom(t *testing.T) {
	check := func(t *testing.T, h *simhost.Host, layout string) {
		t.Helper()
		view, err := h.Manager.FleetView()
		if err != nil {
			t.Fatal(err)
		}
		caps, err := h.Manager.Capacity()
		if err != nil {
			t.Fatal(err)
		}
		type key struct{ model, kind, profile string }
		perModel := map[key]int{}
		for _, p := range desired("hosta", RootUUID("hosta"), view, nil) {
			names := map[string]int{}
			for _, c := range p.gpu.Classes {
				names[ClassName(c.Kind, c.Profile)]++
			}
			for _, c := range p.gpu.Classes {
				perModel[key{p.gpu.Model, string(c.Kind), c.Profile}] += c.Room
				if names[ClassName(c.Kind, c.Profile)] > 1 {
					// One inventory for two profiles: Placement could not
					// count them apart.
					t.Errorf("%s: on %s %s shares class %s with another profile", layout, p.gpu.PCI, c.Profile, ClassName(c.Kind, c.Profile))
					continue
				}
				if n := placementRoom(&p, c); n != c.Room {
					t.Errorf("%s: on %s Placement would take %d of %s; the fleet view's room is %d", layout, p.gpu.PCI, n, c.Profile, c.Room)
				}
			}
		}
		for _, c := range caps {
			if n := perModel[key{c.Model, c.Kind, c.Profile}]; n != c.Count {
				t.Errorf("%s: capacity of %s on %s is %d; Placement is told %d", layout, c.Profile, c.Model, c.Count, n)
			}
		}
	}
	create := func(t *testing.T, h *simhost.Host, profile, pci string) {
		t.Helper()
		if _, err := h.Manager.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: profile, GPU: pci}); err != nil {
			t.Fatalf("create %s on %s: %v", profile, pci, err)
		}
	}
	t.Run("default", func(t *testing.T) {
		h := simhost.Start(t, simhost.Options{})
		simhost.DefineTenant(t, h.Manager, "acme")
		check(t, h, "fresh")
		create(t, h, "3g.40gb", sim.DefaultH100MIG)
		create(t, h, "H100XM-1-10C", sim.DefaultH100MIG)
		create(t, h, "H100XM-8C", sim.DefaultH100TS)
		create(t, h, "L4-4Q", sim.DefaultL4)
		create(t, h, manager.ProfilePassthrough, sim.DefaultA10)
		check(t, h, "mixed")
	})
	t.Run("scale", func(t *testing.T) {
		h := simhost.Start(t, simhost.Options{Spec: &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{
			{Model: "H100-SXM5-80GB", PCI: "0000:11:00.0", Flavour: gpu.FlavourVFIO, MIG: true},
			{Model: "H200-SXM5-141GB", PCI: "0000:31:00.0", Flavour: gpu.FlavourVFIO},
			{Model: "RTX-PRO-6000-BSE-96GB", PCI: "0000:41:00.0", Flavour: gpu.FlavourVFIO, MIG: true},
			{Model: "H100-SXM5-80GB", PCI: "0000:51:00.0", Flavour: gpu.FlavourVFIO, Heterogeneous: true},
			{Model: "A10-24GB", PCI: "0000:71:00.0", Flavour: gpu.FlavourMdev},
			{Model: "L40S-48GB", PCI: "0000:81:00.0", Flavour: gpu.FlavourMdev},
		}}})
		simhost.DefineTenant(t, h.Manager, "acme")
		check(t, h, "fresh")
		create(t, h, "2g.20gb", "0000:11:00.0")
		create(t, h, "H200X-4C", "0000:31:00.0")
		create(t, h, "RTX Pro 6000 Blackwell DC-1-6Q", "0000:41:00.0")
		create(t, h, "RTX Pro 6000 Blackwell DC-2-16Q", "0000:41:00.0")
		create(t, h, "H100XM-20C", "0000:51:00.0")
		create(t, h, "H100XM-10C", "0000:51:00.0")
		create(t, h, "A10-1Q", "0000:71:00.0")
		create(t, h, "L40S-2Q", "0000:81:00.0")
		check(t, h, "mixed")
	})
}
