// Package invariant holds the checks that vgpud's records agree with the
// host, which the crash test (e2e) and the manager's fuzz target run after
// every step: what an instance costs its tenant, worked out from the
// catalog rather than taken from the record, and the records compared with
// the host as discovery sees it. Only tests import it; it imports pkg/gpu,
// pkg/profile and pkg/store.
//
// Imports: pkg/gpu, pkg/profile, pkg/store.
package invariant

import (
	"fmt"
	"slices"
	"strings"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
)

// Cost is what an instance takes of its tenant's quota, from the catalog
// (docs/metrics.md, "Shares: the definitions"): VRAM in bytes and compute in milli-GPU.
func Cost(cat *profile.Catalog, in store.Instance) (vram, compute uint64, err error) {
	m, ok := cat.Model(in.Model)
	if !ok {
		return 0, 0, fmt.Errorf("instance %s: model %q not in the catalog", in.UUID, in.Model)
	}
	gi := func(match func(p *profile.GPUInstanceProfile) bool) *profile.GPUInstanceProfile {
		if m.MIG == nil {
			return nil
		}
		for i := range m.MIG.GPUInstanceProfiles {
			if match(&m.MIG.GPUInstanceProfiles[i]) {
				return &m.MIG.GPUInstanceProfiles[i]
			}
		}
		return nil
	}
	var typ *profile.VGPUType
	if m.VGPU != nil {
		for i := range m.VGPU.Types {
			if m.VGPU.Types[i].Name == in.Profile || m.VGPU.Types[i].Name == in.TypeName {
				typ = &m.VGPU.Types[i]
			}
		}
	}
	switch in.Kind {
	case store.KindMIG:
		p := gi(func(p *profile.GPUInstanceProfile) bool { return p.ID == in.GIProfileID })
		if p == nil {
			return 0, 0, fmt.Errorf("instance %s: no MIG profile %d on %s", in.UUID, in.GIProfileID, m.Name)
		}
		// A compute instance smaller than its GPU instance ("1c.3g.40gb",
		// read from the profile name, not the record): its slices, and the
		// GPU instance's memory in proportion.
		name := in.Profile[strings.LastIndex(in.Profile, "/")+1:]
		if c, _, ok := profile.ParseComputeInstanceName(name); ok && c < p.ComputeSlices {
			return (p.MemoryMiB << 20) * uint64(c) / uint64(p.ComputeSlices), uint64(c) * 1000 / uint64(m.MIG.ComputeSlices), nil
		}
		return p.MemoryMiB << 20, uint64(p.ComputeSlices) * 1000 / uint64(m.MIG.ComputeSlices), nil
	case store.KindMIGVGPU:
		if typ == nil || typ.GPUInstanceProfile == nil {
			return 0, 0, fmt.Errorf("instance %s: no MIG-backed vGPU type %s on %s", in.UUID, in.Profile, m.Name)
		}
		p := gi(func(p *profile.GPUInstanceProfile) bool { return p.ID == *typ.GPUInstanceProfile })
		if p == nil {
			return 0, 0, fmt.Errorf("instance %s: vGPU type %s names GPU-instance profile %d, not on %s", in.UUID, in.Profile, *typ.GPUInstanceProfile, m.Name)
		}
		return typ.FramebufferMiB << 20, uint64(p.ComputeSlices) * 1000 / uint64(m.MIG.ComputeSlices) / uint64(max(1, typ.MaxPerGPUInstance)), nil
	case store.KindVGPU:
		if typ == nil {
			return 0, 0, fmt.Errorf("instance %s: no vGPU type %s on %s", in.UUID, in.Profile, m.Name)
		}
		return typ.FramebufferMiB << 20, 1000 / uint64(typ.MaxInstances), nil
	case store.KindPassthrough:
		return m.MemoryMiB << 20, 1000, nil
	}
	return 0, 0, fmt.Errorf("instance %s: unknown kind %s", in.UUID, in.Kind)
}

// HostDiff compares instance records with the host as discovered: each
// record's parts (GPU instance, compute instance, VF type or mdev) must be
// there, and each device on the host must belong to a record. It returns
// the devices no record explains and the record parts the host lacks.
func HostDiff(inv gpu.Inventory, recs []store.Instance) (extra, missing []string) {
	type giKey struct {
		gpu string
		id  int
	}
	// Several records may own one GPU instance (MIG-backed vGPUs, or
	// compute instances); ownedCI holds the compute instances they own.
	ownedGI := map[giKey]*store.Instance{}
	ownedCI := map[giKey]map[int]bool{}
	ownedVF := map[string]bool{}
	ownedMdev := map[string]bool{}
	for i := range recs {
		r := &recs[i]
		g, ok := inv.ByUUID(r.GPUUUID)
		if !ok {
			missing = append(missing, fmt.Sprintf("instance %s: its GPU %s is not on the host", r.UUID, r.GPUUUID))
			continue
		}
		if r.Kind == store.KindMIG || r.Kind == store.KindMIGVGPU {
			i := slices.IndexFunc(g.MIG.Instances, func(x gpu.GPUInstance) bool {
				return x.Placement.Start == r.GIStart && x.ProfileID == r.GIProfileID
			})
			switch {
			case i < 0:
				missing = append(missing, fmt.Sprintf("instance %s: no GPU instance of profile %d at slot %d on %s", r.UUID, r.GIProfileID, r.GIStart, g.PCI))
			case g.MIG.Instances[i].ID != r.GIID:
				missing = append(missing, fmt.Sprintf("instance %s: the GPU instance at slot %d on %s has id %d, the record says %d", r.UUID, r.GIStart, g.PCI, g.MIG.Instances[i].ID, r.GIID))
			default:
				gi := g.MIG.Instances[i]
				k := giKey{g.UUID, gi.ID}
				ownedGI[k] = r
				if r.Kind != store.KindMIG {
					break
				}
				j := slices.IndexFunc(gi.Compute, func(ci gpu.ComputeInstance) bool { return ci.ID == r.CIID })
				switch {
				case j < 0:
					missing = append(missing, fmt.Sprintf("instance %s: no compute instance %d in GPU instance %d on %s", r.UUID, r.CIID, gi.ID, g.PCI))
				case r.CISlices > 0 && (gi.Compute[j].Placement != gpu.Range{Start: r.CIStart, Size: r.CISlices}):
					missing = append(missing, fmt.Sprintf("instance %s: compute instance %d in GPU instance %d on %s sits at %d+%d, the record says %d+%d",
						r.UUID, r.CIID, gi.ID, g.PCI, gi.Compute[j].Placement.Start, gi.Compute[j].Placement.Size, r.CIStart, r.CISlices))
				default:
					if ownedCI[k] == nil {
						ownedCI[k] = map[int]bool{}
					}
					ownedCI[k][r.CIID] = true
				}
			}
		}
		if r.Kind != store.KindVGPU && r.Kind != store.KindMIGVGPU {
			continue
		}
		switch r.Flow {
		case store.FlowVFIO:
			i := slices.IndexFunc(g.VGPU.VFs, func(vf gpu.VF) bool { return vf.PCI == r.VF })
			if i < 0 || g.VGPU.VFs[i].Type != r.TypeID {
				missing = append(missing, fmt.Sprintf("instance %s: VF %s on %s does not hold vGPU type %d", r.UUID, r.VF, g.PCI, r.TypeID))
				continue
			}
			ownedVF[r.VF] = true
		case store.FlowMdev:
			i := slices.IndexFunc(g.VGPU.Mdevs, func(m gpu.Mdev) bool { return m.UUID == r.MdevUUID })
			if i < 0 || g.VGPU.Mdevs[i].Type != r.TypeID {
				missing = append(missing, fmt.Sprintf("instance %s: no mdev %s of type %d on %s", r.UUID, r.MdevUUID, r.TypeID, g.PCI))
				continue
			}
			ownedMdev[r.MdevUUID] = true
		}
	}
	for _, g := range inv.GPUs {
		for _, gi := range g.MIG.Instances {
			r := ownedGI[giKey{g.UUID, gi.ID}]
			if r == nil {
				extra = append(extra, fmt.Sprintf("GPU instance %d (profile %d, slot %d) on %s: no record", gi.ID, gi.ProfileID, gi.Placement.Start, g.PCI))
				continue
			}
			for _, ci := range gi.Compute {
				if !ownedCI[giKey{g.UUID, gi.ID}][ci.ID] {
					extra = append(extra, fmt.Sprintf("compute instance %d in GPU instance %d on %s: no record", ci.ID, gi.ID, g.PCI))
				}
			}
		}
		for _, vf := range g.VGPU.VFs {
			if vf.Type != 0 && !ownedVF[vf.PCI] {
				extra = append(extra, fmt.Sprintf("VF %s on %s holds vGPU type %d: no record", vf.PCI, g.PCI, vf.Type))
			}
		}
		for _, m := range g.VGPU.Mdevs {
			if !ownedMdev[m.UUID] {
				extra = append(extra, fmt.Sprintf("mdev %s on %s: no record", m.UUID, g.PCI))
			}
		}
	}
	return extra, missing
}

// SetDiff returns what got holds beyond want, and what it lacks of want.
func SetDiff(got, want []string) (extra, missing []string) {
	for _, g := range got {
		if !slices.Contains(want, g) {
			extra = append(extra, g)
		}
	}
	for _, x := range want {
		if !slices.Contains(got, x) {
			missing = append(missing, x)
		}
	}
	return extra, missing
}
