package manager

import (
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
)

// roomKey names one class of instance: its kind and canonical profile name
// (a MIG profile, a vGPU type, ProfilePassthrough).
type roomKey struct {
	kind    store.InstanceKind
	profile string
}

// room is how many more instances of each class one GPU takes now. A
// class the GPU offers in its current mode is present, with 0 when it is
// full; one it does not offer is absent.
type room map[roomKey]int

// roomOn is how many more instances of each profile GPU g takes now, each
// profile counted on its own, exactly as the admission (decide) would
// take them one after another with every create pinned to g. It is the
// one room calculation: the capacity query adds it up per model, the fleet
// view publishes it per GPU, and so Placement and `vgpuctl capacity` give
// the same numbers.
//
//   - A whole GPU: 1 while g is available with nothing carved on it.
//   - MIG profiles (MIG on): the GPU instances of the profile the slot
//     grid still fits.
//   - MIG-backed vGPU types of g's flow: a new GPU instance of the type's
//     size per vGPU it holds (MaxPerGPUInstance of them), plus the free
//     seats of the GPU instances our vGPUs of the same size already share,
//     bounded by the free VFs or mdev parents.
//   - Time-sliced vGPU types of g's flow (MIG off): the engine's room
//     (placement.VGPURoom), bounded by the free VFs or mdev parents.
//
// An unavailable GPU has no room for anything.
func (m *Manager) roomOn(s *snapshot, g *gpu.GPU) room {
	r := room{}
	if s.unavailable(g) != "" {
		return r
	}
	r[roomKey{store.KindPassthrough, ProfilePassthrough}] = 0
	if !s.carved(g) {
		r[roomKey{store.KindPassthrough, ProfilePassthrough}] = 1
	}
	if pg, ok := m.migGPU(s, g); ok && !pg.Unavailable {
		newGIs := map[int]int{} // by GPU-instance profile id
		for _, f := range placement.Capacity([]placement.GPU{pg}) {
			r[roomKey{store.KindMIG, f.Profile}] = f.Count
			newGIs[f.ProfileID] = f.Count
		}
		for _, t := range m.migBackedTypes(g) {
			n := newGIs[*t.GPUInstanceProfile]*max(1, t.MaxPerGPUInstance) + s.freeSeats(m, g, t)
			r[roomKey{store.KindMIGVGPU, t.Name}] = max(0, min(n, s.freeDevices(g, t.ID)))
		}
	}
	if h, ok := m.vgpuHost(s, g); ok && !h.Unavailable {
		md, _ := m.catalog().Model(g.Model) // vgpuHost found it
		for name := range h.Types {
			t, _ := md.VGPUTypeByName(name) // h.Types holds only md's types
			r[roomKey{store.KindVGPU, name}] = max(0, min(placement.VGPURoom(h, name), s.freeDevices(g, t.ID)))
		}
	}
	return r
}

// migBackedTypes are the MIG-backed vGPU types of g's model that g's vGPU
// creation flow can create (none for a model the catalog lacks or a GPU
// without a flow).
func (m *Manager) migBackedTypes(g *gpu.GPU) []*profile.VGPUType {
	md, _ := m.catalog().Model(g.Model) // nil for a model the catalog lacks
	if md == nil || md.VGPU == nil || g.VGPU.Flavour == gpu.FlavourNone || g.VGPU.Flavour == "" {
		return nil
	}
	var out []*profile.VGPUType
	for i := range md.VGPU.Types {
		t := &md.VGPU.Types[i]
		if t.MIGBacked() && md.HasFlow(t, string(g.VGPU.Flavour)) {
			out = append(out, t)
		}
	}
	return out
}

// freeSeats counts the vGPUs of type t the GPU instances our MIG-backed
// vGPUs share on g can still take, by decideMIG's rule: a ready record on
// a GPU instance of t's size whose vGPUs all have t's framebuffer.
func (s *snapshot) freeSeats(m *Manager, g *gpu.GPU, t *profile.VGPUType) int {
	if t.MaxPerGPUInstance <= 1 {
		return 0
	}
	md, _ := m.catalog().Model(g.Model) // the caller found it
	n := 0
	seen := map[int]bool{}
	for _, r := range s.byGPU[g.UUID] {
		if r.Kind != store.KindMIGVGPU || r.State != store.StateReady || r.GIProfileID != *t.GPUInstanceProfile || seen[r.GIStart] {
			continue
		}
		seen[r.GIStart] = true
		on := s.giRecords(g.UUID, r.GIStart, r.GIProfileID)
		same := true
		for _, x := range on {
			if xt, ok := md.VGPUTypeByID(x.TypeID); ok && xt.FramebufferMiB != t.FramebufferMiB {
				same = false
			}
		}
		if same {
			n += max(0, t.MaxPerGPUInstance-len(on))
		}
	}
	return n
}
