package manager_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/virt"
)

// What FuzzManagerOperations checks against: the catalog's cost of an
// instance, the host as discovered, and libvirt (a fake that keeps each
// VM's config in memory). The first two are the crash test's checks
// (e2e/crash_test.go), written again here: another package's test files
// cannot be imported.

// fuzzCost is what an instance takes of its tenant's quota, worked out
// from the catalog as the crash test does (ARCHITECTURE.md, "Shares").
func fuzzCost(cat *profile.Catalog, in store.Instance) (vram, compute uint64, err error) {
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

// fuzzHostDiff compares instance records with the host as discovered: each
// record's parts (GPU instance, compute instance, VF type or mdev) must be
// there, and each device on the host must belong to a record. It returns
// the devices no record explains and the record parts the host lacks.
func fuzzHostDiff(inv gpu.Inventory, recs []store.Instance) (extra, missing []string) {
	type giKey struct {
		gpu string
		id  int
	}
	ownedGI := map[giKey]*store.Instance{}
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
				ownedGI[giKey{g.UUID, gi.ID}] = r
				if r.Kind == store.KindMIG && !slices.ContainsFunc(gi.Compute, func(ci gpu.ComputeInstance) bool { return ci.ID == r.CIID }) {
					missing = append(missing, fmt.Sprintf("instance %s: no compute instance %d in GPU instance %d on %s", r.UUID, r.CIID, gi.ID, g.PCI))
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
				extra = append(extra, fmt.Sprintf("GPU instance %d (profile %d, slot %d) on %s", gi.ID, gi.ProfileID, gi.Placement.Start, g.PCI))
				continue
			}
			for _, ci := range gi.Compute {
				if r.Kind != store.KindMIG || ci.ID != r.CIID {
					extra = append(extra, fmt.Sprintf("compute instance %d in GPU instance %d on %s", ci.ID, gi.ID, g.PCI))
				}
			}
		}
		for _, vf := range g.VGPU.VFs {
			if vf.Type != 0 && !ownedVF[vf.PCI] {
				extra = append(extra, fmt.Sprintf("VF %s on %s holding vGPU type %d", vf.PCI, g.PCI, vf.Type))
			}
		}
		for _, m := range g.VGPU.Mdevs {
			if !ownedMdev[m.UUID] {
				extra = append(extra, fmt.Sprintf("mdev %s on %s", m.UUID, g.PCI))
			}
		}
	}
	return extra, missing
}

// fuzzVirt is libvirt as the fuzz target needs it: persistent VMs that
// are stopped (attaches change the config only, and defragment may move
// their instances), each config a set of hostdevs with the instance vgpud
// recorded for each. It refuses what libvirt refuses: an empty or unknown
// name, another host's URI, a device or instance another VM holds.
type fuzzVirt struct {
	mu  sync.Mutex
	vms map[string]*fuzzVM
}

type fuzzVM struct {
	uuid string
	devs map[string]string // hostdev -> instance
}

const fuzzURI = "qemu:///system"

var _ manager.Virt = (*fuzzVirt)(nil)

// resolve is the VM name a reference names, "" when none.
func (v *fuzzVirt) resolve(ref string) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	name, _, err := v.lookup(ref)
	if err != nil {
		return ""
	}
	return name
}

func (v *fuzzVirt) lookup(ref string) (string, *fuzzVM, error) {
	name := ref
	if strings.Contains(ref, "://") {
		i := strings.LastIndex(ref, "/")
		if ref[:i] != fuzzURI {
			return "", nil, fmt.Errorf("domain %q: %w", ref, virt.ErrOtherHost)
		}
		name = ref[i+1:]
	}
	vm, ok := v.vms[name]
	if !ok {
		return "", nil, fmt.Errorf("domain %q: %w", ref, virt.ErrDomainNotFound)
	}
	return name, vm, nil
}

func fuzzHostdevKey(h virt.Hostdev) string {
	if h.Kind == virt.Mdev {
		return "mdev " + h.MdevUUID
	}
	return "pci " + h.PCI
}

func (v *fuzzVirt) URI() string { return fuzzURI }

func (v *fuzzVirt) Domain(_ context.Context, ref string) (virt.Domain, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	name, vm, err := v.lookup(ref)
	if err != nil {
		return virt.Domain{}, err
	}
	return virt.Domain{Name: name, UUID: vm.uuid, Persistent: true}, nil
}

func (v *fuzzVirt) Attach(_ context.Context, domain string, h virt.Hostdev, instance string) (bool, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if instance == "" || (h.MdevUUID == "" && h.PCI == "") {
		return false, fmt.Errorf("instance %q, hostdev %+v: %w", instance, h, virt.ErrInvalidHostdev)
	}
	name, vm, err := v.lookup(domain)
	if err != nil {
		return false, err
	}
	k := fuzzHostdevKey(h)
	for other, o := range v.vms {
		if other == name {
			continue
		}
		for dk, id := range o.devs {
			if dk == k || id == instance {
				return false, fmt.Errorf("%s (instance %s) is in %s: %w", k, instance, other, virt.ErrAttachedElsewhere)
			}
		}
	}
	vm.devs[k] = instance
	return false, nil
}

func (v *fuzzVirt) Detach(_ context.Context, domain string, h virt.Hostdev, instance string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, vm, err := v.lookup(domain)
	if err != nil {
		return err
	}
	delete(vm.devs, fuzzHostdevKey(h))
	for k, id := range vm.devs {
		if id == instance {
			delete(vm.devs, k)
		}
	}
	return nil
}

func (v *fuzzVirt) Attached(_ context.Context, ref string) ([]virt.Attached, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, vm, err := v.lookup(ref)
	if err != nil {
		return nil, err
	}
	var out []virt.Attached
	for k, id := range vm.devs {
		h := virt.Hostdev{Kind: virt.VF, PCI: strings.TrimPrefix(k, "pci ")}
		if strings.HasPrefix(k, "mdev ") {
			h = virt.Hostdev{Kind: virt.Mdev, MdevUUID: strings.TrimPrefix(k, "mdev ")}
		}
		out = append(out, virt.Attached{Instance: id, Hostdev: h, Config: true, MetadataConfig: true})
	}
	return out, nil
}

func (v *fuzzVirt) Domains(context.Context) ([]virt.Domain, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []virt.Domain
	for name, vm := range v.vms {
		out = append(out, virt.Domain{Name: name, UUID: vm.uuid, Persistent: true})
	}
	return out, nil
}

func (v *fuzzVirt) Events(ctx context.Context) <-chan virt.Event {
	ch := make(chan virt.Event)
	go func() { <-ctx.Done(); close(ch) }()
	return ch
}

func (v *fuzzVirt) Settle(context.Context) error { return nil }

// diff compares the attachment records with the VMs' configs: a VM's
// hostdevs must be the devices of the instances recorded as attached to
// it, each with vgpud's entry for that instance.
func (v *fuzzVirt) diff(s fuzzState) []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	want := map[string]map[string]string{}
	var out []string
	for id, a := range s.atts {
		in, ok := s.insts[id]
		if !ok {
			continue
		}
		var k string
		switch {
		case in.MdevUUID != "":
			k = "mdev " + in.MdevUUID
		case in.VF != "":
			k = "pci " + in.VF
		case in.Kind == store.KindPassthrough:
			k = "pci " + in.GPUPCI
		default:
			out = append(out, fmt.Sprintf("instance %s is recorded as attached to %s but has no device", id, a.Domain))
			continue
		}
		if want[a.Domain] == nil {
			want[a.Domain] = map[string]string{}
		}
		want[a.Domain][k] = id
	}
	for name, vm := range v.vms {
		for k, id := range vm.devs {
			if w, ok := want[name][k]; !ok || w != id {
				out = append(out, fmt.Sprintf("%s's config holds %s for instance %s: no attachment record", name, k, id))
			}
		}
		for k, id := range want[name] {
			if got, ok := vm.devs[k]; !ok || got != id {
				out = append(out, fmt.Sprintf("%s's config lacks %s of instance %s, recorded as attached", name, k, id))
			}
		}
	}
	for name := range want {
		if _, ok := v.vms[name]; !ok {
			out = append(out, fmt.Sprintf("attachments recorded to %s, which is no VM", name))
		}
	}
	return out
}
