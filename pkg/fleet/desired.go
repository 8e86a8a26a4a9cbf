package fleet

import (
	"sort"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
	"github.com/vgpud/vgpud/pkg/store"
)

// gpuProvider is what one GPU's provider should hold.
type gpuProvider struct {
	uuid, name string
	// host is the host's facts about the GPU; gpu the same in Placement's
	// units (units.go).
	host   manager.FleetGPU
	gpu    gpuUnits
	inv    map[string]placementapi.Inventory
	traits []string
	// allocs: consumer (instance UUID) → resources.
	allocs map[string]map[string]int
	// classes: resource class → the profile it stands for.
	classes map[string]unitClass
}

func one(total, reserved, maxUnit int) placementapi.Inventory {
	return placementapi.Inventory{Total: total, Reserved: reserved, MinUnit: 1, MaxUnit: max(1, maxUnit), StepSize: 1, AllocationRatio: 1}
}

// resourcesOf is what one instance holds in Placement: its profile class,
// its share of the GPU class (gpuUnitsOf), its slices on a MIG GPU and its
// framebuffer on a time-sliced GPU.
func resourcesOf(c unitClaim) map[string]int {
	r := map[string]int{ClassName(c.Kind, c.Profile): 1, GPUClass: gpuUnitsOf(c.Kind)}
	if c.Slices > 0 {
		r[SliceClass] = c.Slices
	}
	if c.FramebufferMiB > 0 {
		r[FramebufferClass] = int(c.FramebufferMiB)
	}
	return r
}

// desired turns the host's truth into providers, each GPU's shape
// remembered in sm (nil: as discovered). A class's total is what
// its instances hold plus the room vgpud has for it now, so Placement
// accepts exactly what vgpud would. On a failed or lost GPU everything its
// instances do not hold is reserved: not the whole, or Placement would
// refuse to write (after a wipe or an upgrade) the allocations of the
// instances still recorded there. A GPU passed through whole needs no
// reservation: its allocation holds the whole-GPU class and every shared
// unit (slices, framebuffer), and its other classes have no room.
func desired(host, top string, view []manager.FleetGPU, sm *shapeMemory) []gpuProvider {
	return desiredIn(host, top, view, sm, InventoriesExact, nil)
}

// desiredIn is desired with the inventories of mode (InventoriesExact,
// InventoriesCarvable), carvable totals kept in cache.
func desiredIn(host, top string, view []manager.FleetGPU, sm *shapeMemory, mode string, cache *carveCache) []gpuProvider {
	out := make([]gpuProvider, 0, len(view))
	for _, hg := range view {
		out = append(out, providerOf(host, top, hg, unitsIn(hg, sm, mode, cache)))
	}
	return out
}

// providerOf is what the provider of GPU hg, g in Placement's units,
// should hold.
func providerOf(host, top string, hg manager.FleetGPU, g gpuUnits) gpuProvider {
	p := gpuProvider{uuid: GPUProviderUUID(top, g.PCI), name: GPUProviderName(host, g.PCI), host: hg, gpu: g,
		inv: map[string]placementapi.Inventory{}, traits: traitsOf(g), allocs: map[string]map[string]int{},
		classes: map[string]unitClass{}}
	down := g.State == gpu.StateFailed || g.State == gpu.StateLost
	for _, c := range g.Classes {
		p.classes[ClassName(c.Kind, c.Profile)] = c
	}
	used := map[string]int{}
	for _, c := range g.Instances {
		p.allocs[c.Instance] = resourcesOf(c)
		for rc, n := range p.allocs[c.Instance] {
			used[rc] += n
		}
	}
	for name, c := range p.classes {
		total := used[name] + c.Room
		if total > 0 {
			p.inv[name] = one(total, 0, 1)
		}
	}
	for name, n := range used {
		if _, ok := p.inv[name]; !ok && name != SliceClass && name != FramebufferClass && name != GPUClass {
			p.inv[name] = one(n, 0, 1)
		}
	}
	if g.MIG && g.Slices > 0 {
		p.inv[SliceClass] = one(g.Slices, min(g.Slices, g.Unclaimable+g.HeldBack), g.Slices)
	}
	// Records the fleet does not publish (compute instances narrower
	// than their GPU instance) hold a unit each, reserved.
	p.inv[GPUClass] = one(GPUUnits, min(GPUUnits, g.Unlisted), GPUUnits)
	if fb := int(g.FramebufferMiB); fb > 0 {
		// Every vGPU on the GPU is an instance with an allocation.
		p.inv[FramebufferClass] = one(fb, 0, fb)
	}
	if down {
		for name, inv := range p.inv {
			inv.Reserved = max(0, inv.Total-used[name])
			p.inv[name] = inv
		}
	}
	sort.Strings(p.traits)
	return p
}

// uncarvedOn is what p's provider holds, or is about to hold, beyond the
// host's instances (resource class → units): the allocations in have
// whose consumer the host has not carved (claims Placement accepted, or
// a claim whose create went elsewhere, until it is removed), and p's
// allocations that are no instance's (a claim about to be written,
// claimUnoffered).
func uncarvedOn(p *gpuProvider, have map[string]map[string]int) map[string]int {
	carved := make(map[string]bool, len(p.gpu.Instances))
	for _, c := range p.gpu.Instances {
		carved[c.Instance] = true
	}
	out := map[string]int{}
	for c, r := range have {
		if !carved[c] {
			for rc, n := range r {
				out[rc] += n
			}
		}
	}
	for c, r := range p.allocs {
		if _, ok := have[c]; !ok && !carved[c] {
			for rc, n := range r {
				out[rc] += n
			}
		}
	}
	return out
}

// offers reports whether p's inventories offer Placement the room want
// takes: every class of it has that much beyond what the host's
// instances hold.
func (p *gpuProvider) offers(want map[string]int) bool {
	held := map[string]int{}
	for _, a := range p.allocs {
		for rc, n := range a {
			held[rc] += n
		}
	}
	for rc, n := range want {
		inv, ok := p.inv[rc]
		if !ok || inv.Total-inv.Reserved-held[rc] < n {
			return false
		}
	}
	return true
}

// effective is p's inventories as Placement must hold them with have on
// the provider (consumer → resources, what Placement holds now): the
// host's, except that every class's capacity (total - reserved) is at
// least what is held there, counting for each instance the larger of what
// it holds and what it should hold (the pass writes it next). So usage
// never exceeds a total in Placement, whatever the order of the writes,
// and an instance's allocation is never refused because a scheduler's
// claim took its room while the host carved it: Placement then shows that
// class with no room, and the claim as an allocation without an instance
// until its create is refused as stale or the grace period ends. A class
// the host no longer offers that is still held keeps exactly what is held.
// (Syncer.effectiveNow leaves out of have the claims the host refused as
// stale.)
func effective(p *gpuProvider, have map[string]map[string]int) map[string]placementapi.Inventory {
	used := map[string]int{}
	count := func(h, w map[string]int) {
		for rc, n := range h {
			used[rc] += max(n, w[rc])
		}
		for rc, n := range w {
			if _, ok := h[rc]; !ok {
				used[rc] += n
			}
		}
	}
	for c, h := range have {
		count(h, p.allocs[c])
	}
	for c, w := range p.allocs {
		if _, ok := have[c]; !ok {
			count(nil, w)
		}
	}
	out := make(map[string]placementapi.Inventory, len(p.inv))
	for rc, inv := range p.inv {
		out[rc] = inv
	}
	for rc, u := range used {
		inv, ok := out[rc]
		switch {
		case u <= 0:
		case !ok:
			out[rc] = one(u, 0, u)
		case inv.Total-inv.Reserved < u:
			inv.Total = max(inv.Total, u)
			inv.Reserved = inv.Total - u
			out[rc] = inv
		}
	}
	return out
}

func sameInventories(a, b map[string]placementapi.Inventory) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || v.Total != w.Total || v.Reserved != w.Reserved || v.MaxUnit != w.MaxUnit || v.MinUnit != w.MinUnit ||
			v.StepSize != w.StepSize || v.AllocationRatio != w.AllocationRatio {
			return false
		}
	}
	return true
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]bool{}
	for _, s := range a {
		m[s] = true
	}
	for _, s := range b {
		if !m[s] {
			return false
		}
	}
	return true
}

func sameResources(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// claim is manager claim c in Placement's units on p's GPU.
func (p *gpuProvider) claim(c manager.FleetClaim) unitClaim {
	u := unitClaim{Instance: c.Instance, GPU: c.GPU, Profile: c.Profile, Kind: c.Kind, Incomplete: c.Incomplete, Unconfirmed: c.Unconfirmed}
	u.Slices, u.FramebufferMiB = takes(p.host, p.gpu, c.Kind, c.Profile)
	return u
}

// toManager is c as the manager knows it (without Placement's units).
func toManager(c unitClaim) manager.FleetClaim {
	return manager.FleetClaim{Instance: c.Instance, GPU: c.GPU, Profile: c.Profile, Kind: c.Kind, Incomplete: c.Incomplete, Unconfirmed: c.Unconfirmed}
}

// gpuUnitsOf is what one instance of kind takes of GPUClass: a whole GPU
// all of it, anything else one unit.
func gpuUnitsOf(kind store.InstanceKind) int {
	if kind == store.KindPassthrough {
		return GPUUnits
	}
	return 1
}
