package manager

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/store"
)

// decision is where an admitted request goes.
type decision struct {
	o      offer
	g      *gpu.GPU
	start  int             // GPU-instance start (mig, mig-vgpu with a new GI)
	shared *store.Instance // mig-vgpu, compute instance: an existing GI with room, owned by this record
	// ciStart is a compute instance's start inside its GPU instance.
	ciStart int
	vf      string // vendor-VFIO VF
	parent  string // mdev parent
	reason  string
}

// decide picks GPU, slot and device for a request.
func (m *Manager) decide(s *snapshot, offers []offer, req CreateRequest) (decision, error) {
	pin := ""
	if req.GPU != "" {
		g, err := m.gpuByAnyID(req.GPU)
		if err != nil {
			return decision{}, err
		}
		if why := s.unavailable(&g); why != "" {
			if g.Lost {
				return decision{}, fail(ErrGPULost, nil, "GPU %s is lost; choose another GPU", g.PCI)
			}
			return decision{}, fail(ErrNoCapacity, nil, "GPU %s takes no new instance: %s", g.PCI, why)
		}
		pin = g.UUID
	}
	models := map[string]offer{}
	var names []string
	for _, o := range offers {
		models[o.model.Name] = o
		names = append(names, o.model.Name)
	}
	sort.Strings(names)
	switch offers[0].kind {
	case store.KindMIG:
		if offers[0].ci != nil {
			return m.decideCI(s, models, names, pin, req)
		}
		return m.decideMIG(s, models, names, pin, req, false)
	case store.KindMIGVGPU:
		return m.decideMIG(s, models, names, pin, req, true)
	case store.KindVGPU:
		return m.decideVGPU(s, models, names, pin, req)
	}
	return m.decidePassthrough(s, models, pin)
}

func (m *Manager) gpuOf(s *snapshot, uuid string) *gpu.GPU {
	for i := range s.inv.GPUs {
		if s.inv.GPUs[i].UUID == uuid {
			return &s.inv.GPUs[i]
		}
	}
	return nil
}

// deviceFor picks the VF or mdev parent a vGPU of type typeID will use on g.
func (m *Manager) deviceFor(s *snapshot, g *gpu.GPU, typeID int) (vf, parent string, ok bool) {
	switch g.VGPU.Flavour {
	case gpu.FlavourVFIO:
		vf, ok = s.freeVF(g)
	case gpu.FlavourMdev:
		parent, ok = s.freeMdevParent(g, typeID)
	}
	return vf, parent, ok
}

func (m *Manager) decideMIG(s *snapshot, models map[string]offer, names []string, pin string, req CreateRequest, vgpu bool) (decision, error) {
	if pin != "" {
		if g := m.gpuOf(s, pin); g != nil && g.MIG.Capable && !g.MIG.Enabled {
			if _, ok := models[g.Model]; ok {
				return decision{}, fail(ErrInvalidArgument, nil, "MIG mode is off on GPU %s; enable it first (`vgpuctl gpu mig %s on`) or choose a GPU with MIG on", g.PCI, g.PCI)
			}
		}
	}
	pool := m.migPool(s)
	var any offer
	for _, o := range models {
		any = o
	}
	if vgpu {
		// A GPU instance of ours hosting this size with room takes it first
		// (types with several vGPUs per GPU instance).
		if any.typ.MaxPerGPUInstance > 1 {
			for i := range s.recs {
				r := &s.recs[i]
				if r.Kind != store.KindMIGVGPU || r.State != store.StateReady || models[r.Model].typ == nil || (pin != "" && r.GPUUUID != pin) {
					continue
				}
				t := models[r.Model].typ
				on := s.giRecords(r.GPUUUID, r.GIStart, r.GIProfileID)
				if r.GIProfileID != *t.GPUInstanceProfile || len(on) >= t.MaxPerGPUInstance {
					continue
				}
				sameSize := true
				for _, x := range on {
					// A model the catalog lacks (md nil) tells nothing.
					if md, _ := m.catalog().Model(x.Model); md != nil {
						if xt, ok := md.VGPUTypeByID(x.TypeID); ok && xt.FramebufferMiB != t.FramebufferMiB {
							sameSize = false
						}
					}
				}
				g := m.gpuOf(s, r.GPUUUID)
				if !sameSize || g == nil || s.unavailable(g) != "" {
					continue
				}
				if vf, parent, ok := m.deviceFor(s, g, t.ID); ok {
					return decision{o: models[r.Model], g: g, shared: r, start: r.GIStart, vf: vf, parent: parent,
						reason: fmt.Sprintf("shares GPU instance %d with %s", r.GIID, r.UUID)}, nil
				}
			}
		}
		// Only GPUs with a free VF or mdev parent can host the vGPU.
		for i := range pool {
			g := m.gpuOf(s, pool[i].ID)
			if _, _, ok := m.deviceFor(s, g, models[pool[i].Model].typID()); !ok {
				pool[i].Unavailable = true
			}
		}
	}
	pr := placement.Request{Profile: any.gi.Name, GPU: pin, Models: names, Tenant: req.Tenant, Affinity: req.Affinity}
	dec, err := placement.Place(pool, pr)
	if err != nil {
		if errors.Is(err, placement.ErrUnknownProfile) && m.noMIGEnabled(s, names) {
			return decision{}, fail(ErrInvalidArgument, err, "no GPU of model %s has MIG enabled; enable it first (`vgpuctl gpu mig GPU on`)", strings.Join(names, ", "))
		}
		if errors.Is(err, placement.ErrNoCapacity) {
			return decision{}, m.migOutOfService(s, models, pin, req.Profile, err)
		}
		return decision{}, classify(err, "place %s", req.Profile)
	}
	g := m.gpuOf(s, dec.GPU)
	d := decision{o: models[g.Model], g: g, start: dec.Start, reason: dec.Reason}
	if vgpu {
		// ok holds: GPUs without a free device were marked unavailable.
		d.vf, d.parent, _ = m.deviceFor(s, g, d.o.typ.ID)
	}
	return d, nil
}

func (o offer) typID() int {
	if o.typ == nil {
		return 0
	}
	return o.typ.ID
}

func (m *Manager) noMIGEnabled(s *snapshot, models []string) bool {
	for _, g := range s.inv.GPUs {
		for _, name := range models {
			if g.Model == name && g.MIG.Enabled {
				return false
			}
		}
	}
	return true
}

func (m *Manager) decideVGPU(s *snapshot, models map[string]offer, names []string, pin string, req CreateRequest) (decision, error) {
	hosts := m.vgpuHosts(s)
	var any offer
	for _, o := range models {
		any = o
	}
	for i := range hosts {
		g := m.gpuOf(s, hosts[i].ID)
		if _, _, ok := m.deviceFor(s, g, models[hosts[i].Model].typID()); !ok {
			hosts[i].Unavailable = true
		}
	}
	dec, err := placement.PlaceVGPU(hosts, placement.VGPURequest{Type: any.typ.Name, GPU: pin, Models: names, Tenant: req.Tenant, Affinity: req.Affinity, Wanted: req.Wanted})
	if errors.Is(err, placement.ErrNoCapacity) {
		return decision{}, m.vgpuFull(s, models, pin, any.typ.Name, req.Profile, err)
	}
	if err != nil {
		return decision{}, classify(err, "place %s", req.Profile)
	}
	g := m.gpuOf(s, dec.GPU)
	d := decision{o: models[g.Model], g: g, reason: dec.Reason}
	// ok holds: GPUs without a free device were marked unavailable.
	d.vf, d.parent, _ = m.deviceFor(s, g, d.o.typ.ID)
	return d, nil
}

func (m *Manager) decidePassthrough(s *snapshot, models map[string]offer, pin string) (decision, error) {
	for i := range s.inv.GPUs {
		g := &s.inv.GPUs[i]
		o, ok := models[g.Model]
		if !ok || (pin != "" && g.UUID != pin) || s.unavailable(g) != "" {
			continue
		}
		if s.carved(g) {
			continue
		}
		return decision{o: o, g: g, reason: "whole GPU with nothing carved on it"}, nil
	}
	return decision{}, fail(ErrNoCapacity, nil, "no GPU of model %s is free of instances; destroy what lives on one to pass it through", strings.Join(keys(models), ", "))
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
