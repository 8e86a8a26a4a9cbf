package manager

import (
	"sort"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
)

// FleetGPU is one GPU as the host knows it, for the fleet: its identity,
// state and modes as discovered, its catalog entry, its records and how
// many more of each profile vgpud would accept there now. How Placement
// counts all this (slices, shared framebuffer, class names, the shape of
// a lost GPU) is the fleet's (pkg/fleet).
type FleetGPU struct {
	UUID, PCI, Model string
	State            gpu.State
	// Lost is discovery's word that the GPU does not answer: its modes
	// below are then not known.
	Lost bool
	// MIG is MIG mode on; Flavour the vGPU creation flow; Heterogeneous
	// the time-sliced mode; as discovered now.
	MIG           bool
	Flavour       gpu.Flavour
	Heterogeneous bool
	// Spec is the catalog's model (nil: the catalog lacks it); Grid its
	// MIG slot grid (nil: none).
	Spec *profile.Model
	Grid *placement.Grid
	// SlotsUsed is the slot-grid units the GPU instances on the GPU hold
	// now, vgpud's (recorded, shown or not) and foreign ones alike.
	SlotsUsed int
	// Pool is the GPU's MIG occupancy as the placement engine sees it
	// (zero without a slot grid): the fleet's carvable inventories try
	// the engine's own choices on it.
	Pool    placement.GPU
	Classes []FleetClass
	Records []FleetRecord
}

// FleetClass is one profile the GPU offers in its mode and how many more
// fit now (roomOn).
type FleetClass struct {
	Profile string
	Kind    store.InstanceKind
	Room    int
}

// FleetRecord is one instance recorded on the GPU and the canonical
// profile it holds ("" when the catalog no longer names it).
type FleetRecord struct {
	Record  store.Instance
	Profile string
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

// fleetGPU is g as the fleet sees it: state, modes, records, and a class
// per profile its mode offers with the room roomOn gives.
func (m *Manager) fleetGPU(s *snapshot, g *gpu.GPU) FleetGPU {
	fg := FleetGPU{UUID: g.UUID, PCI: g.PCI, Model: g.Model, Lost: g.Lost, MIG: g.MIG.Enabled, Flavour: g.VGPU.Flavour,
		Heterogeneous: g.VGPU.Heterogeneous, Grid: m.grid(g.Model)}
	fg.State, _ = s.state(g)
	if md, ok := m.catalog().Model(g.Model); ok {
		fg.Spec = md
	}
	for _, r := range s.byGPU[g.UUID] {
		p, _ := m.recordProfile(r)
		fg.Records = append(fg.Records, FleetRecord{Record: *r, Profile: p})
	}
	sort.Slice(fg.Records, func(a, b int) bool { return fg.Records[a].Record.UUID < fg.Records[b].Record.UUID })
	rm := m.roomOn(s, g)
	pg, isMIG := m.migGPU(s, g)
	for _, sl := range pg.Used {
		fg.SlotsUsed += sl.Size
	}
	if isMIG {
		fg.Pool = pg
	}
	if isMIG && fg.MIG {
		// A GPU that takes no MIG instance now publishes no MIG profile.
		for _, p := range pg.Grid.Profiles {
			if n, ok := rm[roomKey{store.KindMIG, p.Name}]; ok {
				fg.Classes = append(fg.Classes, FleetClass{Profile: p.Name, Kind: store.KindMIG, Room: n})
			}
		}
		for _, t := range m.migBackedTypes(g) {
			fg.Classes = append(fg.Classes, FleetClass{Profile: t.Name, Kind: store.KindMIGVGPU, Room: rm[roomKey{store.KindMIGVGPU, t.Name}]})
		}
	}
	if h, ok := m.vgpuHost(s, g); ok && !fg.MIG {
		var vc []FleetClass
		for name := range h.Types {
			vc = append(vc, FleetClass{Profile: name, Kind: store.KindVGPU, Room: rm[roomKey{store.KindVGPU, name}]})
		}
		sort.Slice(vc, func(a, b int) bool { return vc[a].Profile < vc[b].Profile })
		fg.Classes = append(fg.Classes, vc...)
	}
	if fg.Spec != nil {
		fg.Classes = append(fg.Classes, FleetClass{Profile: ProfilePassthrough, Kind: store.KindPassthrough,
			Room: rm[roomKey{store.KindPassthrough, ProfilePassthrough}]})
	}
	return fg
}

// recordProfile is the canonical profile record r holds: its GPU
// instance's profile for a MIG instance, its type for a vGPU,
// ProfilePassthrough for a whole GPU. ok is false when the catalog no
// longer names it.
func (m *Manager) recordProfile(r *store.Instance) (string, bool) {
	switch r.Kind {
	case store.KindMIG:
		if g := m.grid(r.Model); g != nil {
			for _, p := range g.Profiles {
				if p.ID == r.GIProfileID {
					return p.Name, true
				}
			}
		}
	case store.KindMIGVGPU:
		if md, ok := m.catalog().Model(r.Model); ok && r.TypeName != "" {
			if t, ok := md.VGPUTypeByID(r.TypeID); ok {
				return t.Name, true
			}
		}
	case store.KindVGPU:
		return r.TypeName, r.TypeName != ""
	case store.KindPassthrough:
		return ProfilePassthrough, true
	}
	return "", false
}
