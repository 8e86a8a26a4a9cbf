package manager

import (
	"sort"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/store"
)

// FleetGPU is one GPU as the fleet sees it: what is carved on it and how
// many more of each profile vgpud would accept there now.
type FleetGPU struct {
	UUID, PCI, Model string
	State            gpu.State
	// MIG is MIG mode on; Flavour the vGPU creation flow; Heterogeneous
	// the time-sliced mode.
	MIG           bool
	Flavour       gpu.Flavour
	Heterogeneous bool
	// Slices is the slot grid's size on a MIG GPU; Unclaimable the slots
	// held by what the fleet cannot see as allocations (foreign GPU
	// instances, compute instances narrower than their GPU instance, GPU
	// instances whose vGPUs share them).
	Slices, Unclaimable int
	// FramebufferMiB is the framebuffer the vGPUs and a whole GPU share on
	// a time-sliced GPU (sharedFramebuffer; 0 on a MIG GPU).
	FramebufferMiB uint64
	Classes        []FleetClass
	Instances      []FleetClaim
}

// FleetClass is one profile carvable on a GPU and how many more fit now.
type FleetClass struct {
	Profile string
	Kind    store.InstanceKind
	Slices  int
	Room    int
	// FramebufferMiB is what one instance takes of the GPU's shared
	// framebuffer (heterogeneous vGPU mode only, else 0).
	FramebufferMiB uint64
}

// FleetView is the host's truth for the fleet: every GPU, its instances and
// its room per profile, from one consistent snapshot.
func (m *Manager) FleetView() ([]FleetGPU, error) {
	var out []FleetGPU
	err := m.db.View(func(tx *store.Tx) error {
		s, err := m.snapshot(tx)
		if err != nil {
			return err
		}
		for i := range s.inv.GPUs {
			if g := &s.inv.GPUs[i]; g.Model != "" {
				out = append(out, m.fleetGPU(s, g))
			}
		}
		return nil
	})
	if err != nil {
		return nil, classify(err, "fleet view")
	}
	return out, nil
}

// FleetGPUByUUID is one GPU of FleetView, read alone (a claim's or a
// settle's look at the GPU it concerns). ErrNotFound: the host has no GPU
// gpuUUID (or one of no known model).
func (m *Manager) FleetGPUByUUID(gpuUUID string) (FleetGPU, error) {
	var out FleetGPU
	err := m.db.View(func(tx *store.Tx) error {
		s, err := m.snapshot(tx)
		if err != nil {
			return err
		}
		g := m.gpuOf(s, gpuUUID)
		if g == nil || g.Model == "" {
			return fail(ErrNotFound, nil, "no GPU %s on this host", gpuUUID)
		}
		out = m.fleetGPU(s, g)
		return nil
	})
	if err != nil {
		return FleetGPU{}, classify(err, "fleet view of GPU %s", gpuUUID)
	}
	return out, nil
}

// fleetGPU is g as the fleet sees it: its shape (as last seen while it
// answered), state, instances, and a class per profile its mode offers
// with the room roomOn gives.
func (m *Manager) fleetGPU(s *snapshot, g *gpu.GPU) FleetGPU {
	sh := m.shapes.of(g, s)
	fg := FleetGPU{UUID: g.UUID, PCI: g.PCI, Model: g.Model, MIG: sh.mig, Flavour: sh.flavour, Heterogeneous: sh.het}
	fg.State, _ = s.state(g)
	if gr := m.grid(g.Model); gr != nil && fg.MIG {
		fg.Slices = gr.Slices
	}
	fg.FramebufferMiB = m.sharedFramebuffer(g.Model, sh.flavour, fg.MIG, fg.Heterogeneous)
	for _, r := range s.byGPU[g.UUID] {
		if c, ok := m.claimOf(r); ok {
			if fg.FramebufferMiB > 0 {
				c.FramebufferMiB = m.recordFramebuffer(r, fg.FramebufferMiB)
			}
			fg.Instances = append(fg.Instances, c)
		}
	}
	sort.Slice(fg.Instances, func(a, b int) bool { return fg.Instances[a].Instance < fg.Instances[b].Instance })
	rm := m.roomOn(s, g)
	if pg, ok := m.migGPU(s, g); ok && fg.MIG {
		fg.Slices = pg.Grid.Slices
		claimed := 0
		for _, c := range fg.Instances {
			claimed += c.Slices
		}
		used := 0
		for _, sl := range pg.Used {
			used += sl.Size
		}
		fg.Unclaimable = max(0, used-claimed)
		// A GPU that takes no MIG instance now publishes no MIG profile.
		for _, p := range pg.Grid.Profiles {
			if n, ok := rm[roomKey{store.KindMIG, p.Name}]; ok {
				fg.Classes = append(fg.Classes, FleetClass{Profile: p.Name, Kind: store.KindMIG, Slices: p.Size, Room: n})
			}
		}
		for _, t := range m.migBackedTypes(g) {
			c := FleetClass{Profile: t.Name, Kind: store.KindMIGVGPU, Room: rm[roomKey{store.KindMIGVGPU, t.Name}]}
			if t.MaxPerGPUInstance <= 1 {
				p, _ := m.giProfile(g.Model, *t.GPUInstanceProfile)
				c.Slices = p.Size
			}
			fg.Classes = append(fg.Classes, c)
		}
	}
	if h, ok := m.vgpuHost(s, g); ok && !fg.MIG {
		var vc []FleetClass
		for name, tc := range h.Types {
			c := FleetClass{Profile: name, Kind: store.KindVGPU, Room: rm[roomKey{store.KindVGPU, name}]}
			if fg.FramebufferMiB > 0 {
				c.FramebufferMiB = tc.FramebufferMiB
			}
			vc = append(vc, c)
		}
		sort.Slice(vc, func(a, b int) bool { return vc[a].Profile < vc[b].Profile })
		fg.Classes = append(fg.Classes, vc...)
	}
	m.passthroughClass(g, &fg, rm)
	return fg
}

// passthroughClass adds the whole-GPU class to fg, with its room (1 on a
// GPU the admission would pass through now: available, nothing carved). A
// whole GPU also takes every slot of a MIG GPU and all the framebuffer of
// a GPU in heterogeneous mode, so that Placement itself refuses a whole
// GPU together with anything carved on it.
func (m *Manager) passthroughClass(g *gpu.GPU, fg *FleetGPU, rm room) {
	if _, ok := m.catalog().Model(fg.Model); !ok {
		return
	}
	c := FleetClass{Profile: ProfilePassthrough, Kind: store.KindPassthrough, FramebufferMiB: fg.FramebufferMiB,
		Room: rm[roomKey{store.KindPassthrough, ProfilePassthrough}]}
	if fg.MIG {
		c.Slices = fg.Slices
	}
	fg.Classes = append(fg.Classes, c)
	for i := range fg.Instances {
		if fg.Instances[i].Kind == store.KindPassthrough {
			fg.Instances[i].Slices = c.Slices
		}
	}
}
