package fleet

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
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
	return admitsBeside(p.gpu, p.inv, p.allocs, mix)
}

// admitsBeside is Placement's answer to claims of the profiles in mix on
// a provider of GPU g holding inv and the allocations have.
func admitsBeside(g gpuUnits, inv map[string]placementapi.Inventory, have map[string]map[string]int, mix []string) bool {
	used := map[string]int{}
	for _, a := range have {
		for rc, n := range a {
			used[rc] += n
		}
	}
	for _, name := range mix {
		for rc, n := range claimOfProfile(g, name) {
			used[rc] += n
		}
	}
	for rc, n := range used {
		i, ok := inv[rc]
		if !ok || n > i.Total-i.Reserved {
			return false
		}
	}
	return true
}

// claimOfProfile is the resources a claim of one instance of profile
// holds on g (nil: g has no such class, and no class holds nil).
func claimOfProfile(g gpuUnits, profile string) map[string]int {
	uc, ok := unitClassOf(g, profile)
	if !ok {
		return map[string]int{"CUSTOM_NO_SUCH_CLASS": 1}
	}
	return resourcesOf(unitClaim{Profile: profile, Kind: uc.Kind, Slices: uc.Slices})
}

// fillAdmitted adds to mix, at random, profiles Placement admits beside
// have on g with inv, until it admits none more.
func fillAdmitted(rnd *rand.Rand, g gpuUnits, inv map[string]placementapi.Inventory, have map[string]map[string]int, mix []string) []string {
	for {
		var fits []string
		for _, name := range carveProfiles {
			if admitsBeside(g, inv, have, append(append([]string(nil), mix...), name)) {
				fits = append(fits, name)
			}
		}
		if len(fits) == 0 {
			return mix
		}
		mix = append(mix, fits[rnd.IntN(len(fits))])
	}
}

// carveProfiles are the MIG-side profiles of the simulated H100.
var carveProfiles = []string{"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "H100XM-1-10C", "H100XM-2-20C", "H100XM-3-40C"}

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
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, pre := range [][]string{nil, {"2g.20gb"}} {
		var held []string
		for _, p := range pre {
			held = append(held, mustCreate(t, h, p, pci).UUID)
		}
		p := providerAt(t, h, pci, InventoriesCarvable)
		for trial := 0; trial < 12; trial++ {
			mix := fillAdmitted(rnd, p.gpu, p.inv, p.allocs, nil)
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

// TestCarvableWithClaimsInFlight runs an H100 through random churn as a
// fleet runs it: schedulers claim what Placement admits, the host carves
// claims in flight (accepted, not carved yet) in a random order and
// destroys instances, and the inventories are published again after each
// step with the claims in flight on the provider. Every claim Placement
// admitted is carved, and the totals searched from the occupancy with the
// claims in flight (uncarvedOn) hold them: searched from the occupancy
// alone, a class's total can fall below its claims in flight, Placement
// must then hold it raised to them (effective), and the mixes it admits
// beside them are no longer the ones the search found carvable.
func TestCarvableWithClaimsInFlight(t *testing.T) {
	h := simhost.Start(t, simhost.Options{})
	simhost.DefineTenant(t, h.Manager, "acme")
	pci := sim.DefaultH100MIG
	rnd := rand.New(rand.NewPCG(3, 4))
	var made []string
	var inFlight []string
	claims, carved := 0, 0
	for step := 0; step < 600; step++ {
		p := providerAt(t, h, pci, InventoriesCarvable)
		have := maps.Clone(p.allocs)
		for i, name := range inFlight {
			have["in-flight-"+strconv.Itoa(i)] = claimOfProfile(p.gpu, name)
		}
		q := providerOf("h", RootUUID("h"), p.host, unitsWith(p.host, nil, InventoriesCarvable, nil, uncarvedOn(&p, have)))
		inv := effective(&q, have)
		// The totals searched hold the claims in flight: none is raised
		// to what Placement holds, beyond the mixes the search checked.
		if !sameInventories(inv, q.inv) {
			t.Fatalf("step %d: with %v in flight the totals searched are %v; Placement must hold %v", step, inFlight, q.inv, inv)
		}
		switch r := rnd.IntN(10); {
		case r < 5:
			// A scheduler claims one profile Placement admits.
			var fits []string
			for _, name := range carveProfiles {
				if admitsBeside(p.gpu, inv, have, []string{name}) {
					fits = append(fits, name)
				}
			}
			if len(fits) > 0 {
				inFlight = append(inFlight, fits[rnd.IntN(len(fits))])
				claims++
			}
		case r < 8 && len(inFlight) > 0:
			// The host carves a claim in flight.
			i := rnd.IntN(len(inFlight))
			name := inFlight[i]
			inFlight = append(inFlight[:i], inFlight[i+1:]...)
			r, err := h.Manager.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: name, GPU: pci})
			if err != nil {
				t.Fatalf("step %d: %s admitted by Placement beside %v, not carved: %v", step, name, inFlight, err)
			}
			made = append(made, r.UUID)
			carved++
		case len(made) > 0:
			i := rnd.IntN(len(made))
			if err := h.Manager.Destroy(context.Background(), made[i], manager.DestroyOptions{}); err != nil {
				t.Fatal(err)
			}
			made = append(made[:i], made[i+1:]...)
		}
	}
	if claims < 100 || carved < 100 {
		t.Fatalf("%d claims and %d carves in the churn: too few to say", claims, carved)
	}
}
