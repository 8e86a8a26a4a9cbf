package manager

import (
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/store"
)

// hostGI finds the GPU instance of a record on the host (by placement and
// profile: ids change across reboots).
func hostGI(g *gpu.GPU, r *store.Instance) *gpu.GPUInstance {
	for i := range g.MIG.Instances {
		gi := &g.MIG.Instances[i]
		if gi.Placement.Start == r.GIStart && gi.ProfileID == r.GIProfileID {
			return gi
		}
	}
	return nil
}

// hostGPU is a GPU of the cached inventory by UUID; nil when the host does
// not show it.
func (m *Manager) hostGPU(uuid string) *gpu.GPU {
	inv := m.Inventory()
	for i := range inv.GPUs {
		if inv.GPUs[i].UUID == uuid {
			return &inv.GPUs[i]
		}
	}
	return nil
}

// present reports which parts of a record the host shows, filling in the
// driver's ids (a crash may come between a host call and its record).
func (m *Manager) present(r *store.Instance) (gi, ci, vg bool) {
	g := m.hostGPU(r.GPUUUID)
	if g == nil || g.Lost {
		return
	}
	if r.Kind == store.KindMIG || r.Kind == store.KindMIGVGPU {
		if x := hostGI(g, r); x != nil {
			gi = true
			r.GIID = x.ID
			for _, c := range x.Compute {
				switch {
				case r.CISlices > 0:
					// One of several compute instances: the record's is
					// the one at its placement (ids change across reboots).
					if c.Placement.Start == r.CIStart && c.Placement.Size == r.CISlices && c.ProfileID == r.CIProfileID {
						ci, r.CIID = true, c.ID
					}
				case r.CIID < 0 || c.ID == r.CIID:
					ci, r.CIID, r.CIProfileID = true, c.ID, c.ProfileID
				}
			}
		}
	}
	switch {
	case r.Flow == store.FlowVFIO:
		for _, vf := range g.VGPU.VFs {
			if vf.PCI == r.VF && vf.Type == r.TypeID {
				vg = true
			}
		}
	case r.Flow == store.FlowMdev:
		// The record's mdev is the one with its UUID on its parent with
		// its type: an mdev with the UUID elsewhere is another's.
		for i := range g.VGPU.Mdevs {
			if sameMdev(&g.VGPU.Mdevs[i], r) {
				vg = true
			}
		}
	}
	return gi, ci, vg
}

// complete reports whether the parts the host shows (present) make up the
// record's whole instance.
func complete(r *store.Instance, gi, ci, vg bool) bool {
	switch r.Kind {
	case store.KindMIG:
		return gi && ci
	case store.KindMIGVGPU:
		return gi && vg
	case store.KindVGPU:
		return vg
	}
	return true
}
