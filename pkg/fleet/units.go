package fleet

import (
	"sync"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
)

// Placement's accounting units, derived from the host's facts
// (manager.FleetGPU): the slices of a MIG GPU's slot grid, the
// framebuffer a time-sliced GPU shares, what each class and each record
// takes of them, and the shape a lost GPU's allocations were written with.

// gpuUnits is one GPU in Placement's units.
type gpuUnits struct {
	UUID, PCI, Model string
	State            gpu.State
	// MIG, Flavour and Heterogeneous are the GPU's shape: as discovered,
	// or for a lost GPU as last discovered while it answered.
	MIG           bool
	Flavour       gpu.Flavour
	Heterogeneous bool
	// Slices is the slot grid's size on a MIG GPU; Unclaimable the slots
	// held by what the fleet cannot see as allocations (foreign GPU
	// instances, compute instances narrower than their GPU instance, GPU
	// instances whose vGPUs share them).
	Slices, Unclaimable int
	// HeldBack is the free slots the slice class does not offer, so that
	// every mix of claims it and the classes' totals admit is carvable
	// (InventoriesCarvable; 0 with exact inventories).
	HeldBack int
	// FramebufferMiB is the framebuffer the vGPUs and a whole GPU share on
	// a time-sliced GPU (sharedFramebuffer; 0 on a MIG GPU).
	FramebufferMiB uint64
	// Unlisted is the records the fleet does not publish (compute
	// instances narrower than their GPU instance, records whose profile
	// the catalog no longer names): each holds a unit of GPUClass,
	// reserved.
	Unlisted  int
	Classes   []unitClass
	Instances []unitClaim
	// Moved are the instances whose allocation is held under their
	// migration's consumer (their unitClaim's Instance) while their VM
	// moves to another host.
	Moved []string
	// Migrations are those migration consumers.
	Migrations []string
}

// unitClass is one profile carvable on a GPU, what one instance of it
// takes of the GPU's shared units, and how many more fit now.
type unitClass struct {
	Profile string
	Kind    store.InstanceKind
	Slices  int
	Room    int
	// FramebufferMiB is what one instance takes of the GPU's shared
	// framebuffer (0 where there is none).
	FramebufferMiB uint64
}

// unitClaim is one instance's share of one GPU in Placement's units;
// Instance is the consumer holding it (the instance's UUID, or its
// migration's consumer).
type unitClaim struct {
	Instance, GPU, Profile string
	Kind                   store.InstanceKind
	// Slices are the slot-grid units the instance holds: its GPU
	// instance's size for a MIG instance and a MIG-backed vGPU alone in
	// its GPU instance, the whole grid for a whole GPU in MIG mode, else 0.
	Slices int
	// FramebufferMiB is what the instance takes of the GPU's shared
	// framebuffer (a whole GPU all of it), else 0.
	FramebufferMiB uint64
	// Incomplete and Unconfirmed as manager.FleetClaim's.
	Incomplete, Unconfirmed bool
}

// unitsOf is g in Placement's units, its shape remembered in sm, with
// exact inventories.
func unitsOf(g manager.FleetGPU, sm *shapeMemory) gpuUnits {
	return unitsIn(g, sm, InventoriesExact, nil)
}

// unitsIn is g in Placement's units with the inventories of mode
// (InventoriesExact, InventoriesCarvable), carvable totals kept in cache.
func unitsIn(g manager.FleetGPU, sm *shapeMemory, mode string, cache *carveCache) gpuUnits {
	return unitsWith(g, sm, mode, cache, nil)
}

// unitsWith is unitsIn with carvable totals that also keep carvable every
// mix holding uncarved: what Placement's allocations on the GPU hold
// beyond the host's instances (resource class → units, uncarvedOn).
func unitsWith(g manager.FleetGPU, sm *shapeMemory, mode string, cache *carveCache, uncarved map[string]int) gpuUnits {
	sh := sm.of(g)
	u := gpuUnits{UUID: g.UUID, PCI: g.PCI, Model: g.Model, State: g.State, MIG: sh.mig, Flavour: sh.flavour, Heterogeneous: sh.het}
	if g.Grid != nil && u.MIG {
		u.Slices = g.Grid.Slices
	}
	u.FramebufferMiB = sharedFramebuffer(g.Spec, sh)
	for _, r := range g.Records {
		if r.Record.MigrationConsumer != "" {
			u.Moved = append(u.Moved, r.Record.UUID)
			u.Migrations = append(u.Migrations, r.Record.MigrationConsumer)
		}
		if c, ok := claimOf(g, r, u); ok {
			u.Instances = append(u.Instances, c)
		} else {
			u.Unlisted++
		}
	}
	for _, c := range g.Classes {
		uc := unitClass{Profile: c.Profile, Kind: c.Kind, Room: c.Room}
		uc.Slices, uc.FramebufferMiB = takes(g, u, c.Kind, c.Profile)
		u.Classes = append(u.Classes, uc)
	}
	if u.MIG {
		claimed := 0
		for _, c := range u.Instances {
			if c.Kind != store.KindPassthrough {
				claimed += c.Slices
			}
		}
		u.Unclaimable = max(0, g.SlotsUsed-claimed)
	}
	if mode == InventoriesCarvable {
		carvable(&u, g, cache, uncarved)
	}
	return u
}

// takes is what one instance of profile (of kind) takes of g's shared
// units: a MIG instance and a MIG-backed vGPU alone in its GPU instance
// its GPU instance's slots, a time-sliced vGPU its type's framebuffer
// where the GPU shares one, a whole GPU every slot offered and all the
// framebuffer. vGPUs of types that share a GPU instance take no slots: one
// GPU instance's slots cannot be split among its vGPUs in whole units, so
// they are unclaimable once (reserved on the slice class).
func takes(g manager.FleetGPU, u gpuUnits, kind store.InstanceKind, name string) (slices int, fb uint64) {
	switch kind {
	case store.KindMIG:
		return giSize(g.Grid, func(p placement.Profile) bool { return p.Name == name }), 0
	case store.KindMIGVGPU:
		if t := typeByName(g.Spec, name); t != nil && t.MaxPerGPUInstance <= 1 && t.GPUInstanceProfile != nil {
			return giSize(g.Grid, func(p placement.Profile) bool { return p.ID == *t.GPUInstanceProfile }), 0
		}
	case store.KindVGPU:
		if t := typeByName(g.Spec, name); t != nil && u.FramebufferMiB > 0 {
			return 0, t.FramebufferMiB
		}
	case store.KindPassthrough:
		// Every slot Placement offers: with carvable inventories a free
		// GPU's slice class may hold some back (HeldBack), and a whole
		// GPU's claim there must still fit; once it is carved the GPU
		// holds nothing back and its allocation takes the whole grid.
		return u.Slices - u.HeldBack, u.FramebufferMiB
	}
	return 0, 0
}

// claimOf is what record r of g holds in the fleet's terms (ok false for
// a record the fleet does not publish). Compute instances narrower than
// their GPU instance are not published: their GPU instance's slots count
// as unclaimable once, however many share it.
func claimOf(g manager.FleetGPU, fr manager.FleetRecord, u gpuUnits) (unitClaim, bool) {
	r := &fr.Record
	if fr.Profile == "" || (r.Kind == store.KindMIG && r.CISlices > 0) {
		return unitClaim{}, false
	}
	// The consumer holding the allocation: the migration's while the VM
	// moves away.
	consumer := r.UUID
	if r.MigrationConsumer != "" {
		consumer = r.MigrationConsumer
	}
	c := unitClaim{Instance: consumer, GPU: r.GPUUUID, Profile: fr.Profile, Kind: r.Kind, Unconfirmed: r.FleetConsumer && r.State == store.StateCreating}
	c.Slices, c.FramebufferMiB = takes(g, u, r.Kind, fr.Profile)
	return c, true
}

// giSize is the size of the first GPU-instance profile of grid that match
// takes (0 without a grid or a match).
func giSize(grid *placement.Grid, match func(placement.Profile) bool) int {
	if grid == nil {
		return 0
	}
	for _, p := range grid.Profiles {
		if match(p) {
			return p.Size
		}
	}
	return 0
}

// typeByName is md's vGPU type name (nil: none).
func typeByName(md *profile.Model, name string) *profile.VGPUType {
	if md == nil {
		return nil
	}
	t, _ := md.VGPUTypeByName(name)
	return t
}

// sharedFramebuffer is the framebuffer, in MiB, the fleet publishes as
// shared by what a time-sliced GPU holds (0 on a MIG GPU or one without a
// vGPU flow), so that Placement itself refuses a whole GPU together with
// any vGPU on it, and vGPUs whose framebuffer exceeds the GPU together. In
// heterogeneous mode it is the GPU's memory, the bound the engine applies
// (placement.VGPURoom); in homogeneous mode the most any one type fills
// (its per-GPU maximum times its framebuffer), so that it never binds a
// type before the type's own maximum does.
func sharedFramebuffer(md *profile.Model, sh fleetShape) uint64 {
	if md == nil || sh.mig || md.VGPU == nil || sh.flavour == gpu.FlavourNone || sh.flavour == "" {
		return 0
	}
	if sh.het {
		return md.MemoryMiB
	}
	var most uint64
	for i := range md.VGPU.Types {
		t := &md.VGPU.Types[i]
		if !t.MIGBacked() && md.HasFlow(t, string(sh.flavour)) {
			most = max(most, uint64(t.MaxInstances)*t.FramebufferMiB)
		}
	}
	return most
}

// fleetShape is what of a GPU's modes its allocations depend on.
type fleetShape struct {
	mig, het bool
	flavour  gpu.Flavour
}

// shapeMemory keeps each GPU's shape as last discovered while it
// answered: discovery of a lost GPU knows its identity but not its modes,
// and its allocations (a whole GPU's slices, a vGPU's framebuffer) must
// keep the shape they were written with, or the sync would rewrite them
// on a provider that is fully reserved. The Runner keeps one for the
// daemon's life, across the syncers a reload replaces.
type shapeMemory struct {
	mu   sync.Mutex
	last map[string]fleetShape
}

func (sm *shapeMemory) of(g manager.FleetGPU) fleetShape {
	now := fleetShape{mig: g.MIG, het: g.Heterogeneous, flavour: g.Flavour}
	if sm == nil {
		sm = &shapeMemory{}
	}
	sm.mu.Lock()
	defer sm.mu.Unlock()
	if sm.last == nil {
		sm.last = map[string]fleetShape{}
	}
	if !g.Lost {
		sm.last[g.UUID] = now
		return now
	}
	if sh, ok := sm.last[g.UUID]; ok {
		return sh
	}
	// Lost since before this process started: its records tell MIG mode.
	for _, r := range g.Records {
		if r.Record.Kind == store.KindMIG || r.Record.Kind == store.KindMIGVGPU {
			now.mig = true
		}
	}
	return now
}
