package manager

import (
	"sync"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/store"
)

// Placement's accounting units, as the fleet view states them: the slices
// of a MIG GPU's slot grid, the framebuffer a time-sliced GPU shares, what
// each record holds of them (claimOf), and the shape of a GPU its
// allocations were written with (shapeMemory).

// slicesOf is how many slot-grid units offer o covers on model (0 for
// offers that take no GPU instance).
func (m *Manager) slicesOf(model string, o offer) int {
	if o.gi == nil {
		return 0
	}
	if g := m.grid(model); g != nil {
		if p, ok := g.Profile(o.gi.Name); ok {
			return p.Size
		}
	}
	return 0
}

// fleetSlices is how many slot-grid units an instance of offer o on g
// consumes in the fleet: a MIG instance and a MIG-backed vGPU alone in its
// GPU instance its GPU instance's size; a whole GPU in MIG mode every slot.
// vGPUs of types that share a GPU instance consume none: one GPU
// instance's slots cannot be split among its vGPUs in whole units, so the
// fleet view reserves them once (FleetGPU.Unclaimable).
func (m *Manager) fleetSlices(g *gpu.GPU, o offer) int {
	switch o.kind {
	case store.KindMIG:
		return m.slicesOf(g.Model, o)
	case store.KindMIGVGPU:
		if o.typ.MaxPerGPUInstance <= 1 {
			return m.slicesOf(g.Model, o)
		}
	case store.KindPassthrough:
		if gr := m.grid(g.Model); gr != nil && g.MIG.Enabled {
			return gr.Slices
		}
	}
	return 0
}

// fleetFramebuffer is what an instance of offer o on g takes of g's shared
// framebuffer (sharedFramebuffer): a time-sliced vGPU its type's
// framebuffer, a whole GPU all of it; else 0.
func (m *Manager) fleetFramebuffer(g *gpu.GPU, o offer) uint64 {
	all := m.sharedFramebuffer(g.Model, g.VGPU.Flavour, g.MIG.Enabled, g.VGPU.Heterogeneous)
	switch {
	case all == 0:
		return 0
	case o.kind == store.KindVGPU:
		return o.typ.FramebufferMiB
	case o.kind == store.KindPassthrough:
		return all
	}
	return 0
}

// sharedFramebuffer is the framebuffer, in MiB, the fleet publishes as
// shared by what a time-sliced GPU holds (0 on a MIG GPU or one without a
// vGPU flow), so that Placement itself refuses a whole GPU together with
// any vGPU on it, and vGPUs whose framebuffer exceeds the GPU together. In
// heterogeneous mode it is the GPU's memory, the bound the engine applies
// (placement.VGPURoom); in homogeneous mode the most any one type fills
// (its per-GPU maximum times its framebuffer), so that it never binds a
// type before the type's own maximum does.
func (m *Manager) sharedFramebuffer(model string, flavour gpu.Flavour, mig, het bool) uint64 {
	md, ok := m.catalog().Model(model)
	if !ok || mig || md.VGPU == nil || flavour == gpu.FlavourNone || flavour == "" {
		return 0
	}
	if het {
		return md.MemoryMiB
	}
	var most uint64
	for i := range md.VGPU.Types {
		t := &md.VGPU.Types[i]
		if !t.MIGBacked() && md.HasFlow(t, string(flavour)) {
			most = max(most, uint64(t.MaxInstances)*t.FramebufferMiB)
		}
	}
	return most
}

// claimOf is what record r holds in the fleet's terms. Compute instances
// narrower than their GPU instance are not published: their GPU instance's
// slots count as unclaimable (reserved on the slice class) once, however
// many share it. A whole GPU's slices are filled in by fleetView, which
// knows whether the GPU is in MIG mode.
func (m *Manager) claimOf(r *store.Instance) (FleetClaim, bool) {
	c := FleetClaim{Instance: r.UUID, GPU: r.GPUUUID, Kind: r.Kind, Unconfirmed: r.FleetConsumer && r.State == store.StateCreating}
	switch r.Kind {
	case store.KindMIG:
		if r.CISlices > 0 {
			return FleetClaim{}, false
		}
		p, ok := m.giProfile(r.Model, r.GIProfileID)
		c.Profile, c.Slices = p.Name, p.Size
		return c, ok
	case store.KindMIGVGPU:
		md, _ := m.catalog().Model(r.Model) // nil for a model the catalog lacks
		if md == nil || r.TypeName == "" {
			return FleetClaim{}, false
		}
		t, ok := md.VGPUTypeByID(r.TypeID)
		if !ok {
			return FleetClaim{}, false
		}
		c.Profile = t.Name
		if t.MaxPerGPUInstance <= 1 {
			p, ok := m.giProfile(r.Model, r.GIProfileID)
			if !ok {
				return FleetClaim{}, false
			}
			c.Slices = p.Size
		}
		return c, true
	case store.KindVGPU:
		c.Profile = r.TypeName
		return c, r.TypeName != ""
	case store.KindPassthrough:
		c.Profile = ProfilePassthrough
		return c, true
	}
	return FleetClaim{}, false
}

// giProfile is the GPU-instance profile id of model's slot grid.
func (m *Manager) giProfile(model string, id int) (placement.Profile, bool) {
	if g := m.grid(model); g != nil {
		for _, p := range g.Profiles {
			if p.ID == id {
				return p, true
			}
		}
	}
	return placement.Profile{}, false
}

// recordFramebuffer is what record r takes of its GPU's shared framebuffer
// (all MiB for a whole GPU).
func (m *Manager) recordFramebuffer(r *store.Instance, all uint64) uint64 {
	switch r.Kind {
	case store.KindPassthrough:
		return all
	case store.KindVGPU:
		if md, ok := m.catalog().Model(r.Model); ok {
			if t, ok := md.VGPUTypeByID(r.TypeID); ok {
				return t.FramebufferMiB
			}
		}
	}
	return 0
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
// on a provider that is fully reserved.
type shapeMemory struct {
	mu   sync.Mutex
	last map[string]fleetShape
}

func (sm *shapeMemory) of(g *gpu.GPU, s *snapshot) fleetShape {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	if sm.last == nil {
		sm.last = map[string]fleetShape{}
	}
	if !g.Lost {
		sh := fleetShape{mig: g.MIG.Enabled, het: g.VGPU.Heterogeneous, flavour: g.VGPU.Flavour}
		sm.last[g.UUID] = sh
		return sh
	}
	if sh, ok := sm.last[g.UUID]; ok {
		return sh
	}
	// Lost since before this process started: its records tell MIG mode.
	sh := fleetShape{mig: g.MIG.Enabled, het: g.VGPU.Heterogeneous, flavour: g.VGPU.Flavour}
	for _, r := range s.byGPU[g.UUID] {
		if r.Kind == store.KindMIG || r.Kind == store.KindMIGVGPU {
			sh.mig = true
		}
	}
	return sh
}
