package fleet

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// providerAt is what the GPU at pci of h should hold in Placement with
// the inventories of mode.
func providerAt(t *testing.T, h *simhost.Host, pci, mode string) gpuProvider {
	t.Helper()
	view, err := h.Manager.FleetView()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range desiredIn("h", RootUUID("h"), view, nil, mode, nil) {
		if p.gpu.PCI == pci {
			return p
		}
	}
	t.Fatalf("no GPU %s in the fleet view", pci)
	return gpuProvider{}
}

// admits is Placement's answer to claims of the profiles in mix (one
// instance each) on p beside the instances it holds: every class's usage
// within its total less what is reserved.
func admits(p gpuProvider, mix []string) bool {
	used := map[string]int{}
	for _, a := range p.allocs {
		for rc, n := range a {
			used[rc] += n
		}
	}
	for _, name := range mix {
		uc, ok := unitClassOf(p.gpu, name)
		if !ok {
			return false
		}
		for rc, n := range resourcesOf(unitClaim{Profile: name, Kind: uc.Kind, Slices: uc.Slices}) {
			used[rc] += n
		}
	}
	for rc, n := range used {
		inv, ok := p.inv[rc]
		if !ok || n > inv.Total-inv.Reserved {
			return false
		}
	}
	return true
}

// TestCarvableInventoriesRefuseAStaleMix: on an empty H100 the exact
// inventories admit four 1g.10gb and a 3g.40gb at once (7 and 2 rooms, 8
// slices), which the host cannot carve when the 1g.10gb come first (the
// engine puts them at slots 6, 5, 4, 3: no aligned start is left for the
// 3g.40gb): a stale claim. The carvable inventories refuse that mix in
// Placement.
func TestCarvableInventoriesRefuseAStaleMix(t *testing.T) {
	h := simhost.Start(t, simhost.Options{})
	simhost.DefineTenant(t, h.Manager, "acme")
	pci := sim.DefaultH100MIG
	mix := []string{"1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "3g.40gb"}
	if !admits(providerAt(t, h, pci, InventoriesExact), mix) {
		t.Fatal("the exact inventories refuse four 1g.10gb and a 3g.40gb on an empty H100")
	}
	carv := providerAt(t, h, pci, InventoriesCarvable)
	if admits(carv, mix) {
		t.Fatal("the carvable inventories admit four 1g.10gb and a 3g.40gb on an empty H100")
	}
	// A whole GPU's claim still fits: it takes the slots offered.
	whole := resourcesOf(carv.claim(manager.FleetClaim{Profile: manager.ProfilePassthrough, Kind: store.KindPassthrough}))
	if inv := carv.inv[SliceClass]; whole[SliceClass] != inv.Total-inv.Reserved || whole[SliceClass] == 0 {
		t.Fatalf("a whole GPU's claim takes %d slices; the slice class offers %d", whole[SliceClass], inv.Total-inv.Reserved)
	}
	for _, p := range mix[:4] {
		mustCreate(t, h, p, pci)
	}
	_, err := h.Manager.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb", GPU: pci})
	if !errors.Is(err, manager.ErrNoCapacity) {
		t.Fatalf("3g.40gb after four 1g.10gb: %v; want the refusal that makes the exact inventories' claim stale", err)
	}
}

// TestCarvableMixesCarve: from an empty H100 and from one holding a
// 2g.20gb, every random mix the carvable inventories admit in Placement
// (claims added while Placement would accept one more) is carved by the
// host, created one by one in a random order.
func TestCarvableMixesCarve(t *testing.T) {
	h := simhost.Start(t, simhost.Options{})
	simhost.DefineTenant(t, h.Manager, "acme")
	pci := sim.DefaultH100MIG
	profiles := []string{"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "H100XM-1-10C", "H100XM-2-20C", "H100XM-3-40C"}
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, pre := range [][]string{nil, {"2g.20gb"}} {
		var held []string
		for _, p := range pre {
			held = append(held, mustCreate(t, h, p, pci).UUID)
		}
		p := providerAt(t, h, pci, InventoriesCarvable)
		for trial := 0; trial < 12; trial++ {
			var mix []string
			for {
				var fits []string
				for _, name := range profiles {
					if admits(p, append(append([]string(nil), mix...), name)) {
						fits = append(fits, name)
					}
				}
				if len(fits) == 0 {
					break
				}
				mix = append(mix, fits[rnd.IntN(len(fits))])
			}
			rnd.Shuffle(len(mix), func(i, j int) { mix[i], mix[j] = mix[j], mix[i] })
			var made []string
			for _, name := range mix {
				r, err := h.Manager.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: name, GPU: pci})
				if err != nil {
					t.Fatalf("after %v: mix %v (admitted by the carvable inventories) not carved: %s: %v", pre, mix, name, err)
				}
				made = append(made, r.UUID)
			}
			for _, id := range made {
				if err := h.Manager.Destroy(context.Background(), id, manager.DestroyOptions{}); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, id := range held {
			if err := h.Manager.Destroy(context.Background(), id, manager.DestroyOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
}
