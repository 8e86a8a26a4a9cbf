package profile

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Known NVML profile index constants: GPU_INSTANCE_PROFILE_COUNT is 18.
const gpuInstanceProfileCount = 18

var (
	modelNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.\-]{1,62}$`)
	giNameRE    = regexp.MustCompile(`^[0-9]+g\.[0-9]+gb(\+me|\+me\.all|-me|\+gfx)?$`)
	typeNameRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9 \-]*-[0-9]+[QBAC](ME|NOME|MEALL|GFX)?$`)
	resRE       = regexp.MustCompile(`^[0-9]{3,5}x[0-9]{3,5}$`)
	archs       = map[string]bool{"pascal": true, "volta": true, "turing": true, "ampere": true, "ada": true, "hopper": true, "blackwell": true}
)

// fieldErrs collects errors with their field path.
type fieldErrs struct{ errs []error }

func (f *fieldErrs) add(field, format string, args ...any) {
	f.errs = append(f.errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
}

// Validate checks one model: every rule that, broken, would make the
// simulator or the planner wrong. The error names the model and each field.
func (m *Model) Validate() error {
	var f fieldErrs
	if m.Version != SchemaVersion {
		if m.Version == "" {
			f.add("version", "missing; this build reads version %q", SchemaVersion)
		} else {
			f.add("version", "%q is not supported; this build reads version %q", m.Version, SchemaVersion)
		}
	}
	if !modelNameRE.MatchString(m.Name) {
		f.add("name", "%q must be 2-63 letters, digits, '.' or '-'", m.Name)
	}
	if m.Product == "" {
		f.add("product", "missing (the name NVML reports)")
	}
	if !archs[m.Architecture] {
		f.add("architecture", "%q is not one of pascal, volta, turing, ampere, ada, hopper, blackwell", m.Architecture)
	}
	if len(m.PCIDeviceIDs) == 0 {
		f.add("pciDeviceIDs", "at least one PCI device id is needed")
	}
	for i, id := range m.PCIDeviceIDs {
		if _, err := parseHex16(id); err != nil {
			f.add(fmt.Sprintf("pciDeviceIDs[%d]", i), "%v", err)
		}
	}
	if m.MemoryMiB == 0 {
		f.add("memoryMiB", "must be positive")
	}
	if m.UsableMemoryMiB == 0 || m.UsableMemoryMiB > m.MemoryMiB {
		f.add("usableMemoryMiB", "%d must be positive and at most memoryMiB %d", m.UsableMemoryMiB, m.MemoryMiB)
	}
	if m.SMs <= 0 {
		f.add("sms", "must be positive")
	}
	if m.MIG != nil {
		m.validateMIG(&f)
	}
	if m.VGPU != nil {
		m.validateVGPU(&f)
	}
	if m.MIG == nil && m.VGPU == nil {
		f.add("mig/vgpu", "a model needs MIG profiles, vGPU types or both")
	}
	// Checked on an otherwise valid model only: the bound is computed from
	// the fields above.
	if len(f.errs) == 0 {
		if n := m.MostInstances(); n > MaxInstancesPerGPU {
			f.errs = append(f.errs, fmt.Errorf("mig/vgpu: one GPU can hold up to %d instances, more than %d: %w", n, MaxInstancesPerGPU, ErrTooManyInstances))
		}
	}
	if len(f.errs) == 0 {
		return nil
	}
	return fmt.Errorf("model %s: %w", m.Name, errors.Join(f.errs...))
}

func (m *Model) validateMIG(f *fieldErrs) {
	g := m.MIG
	if g.MemorySlices <= 0 || g.MemorySlices > 32 {
		f.add("mig.memorySlices", "%d must be 1..32", g.MemorySlices)
		return
	}
	if g.ComputeSlices <= 0 || g.ComputeSlices > g.MemorySlices {
		f.add("mig.computeSlices", "%d must be 1..memorySlices (%d)", g.ComputeSlices, g.MemorySlices)
	}
	if len(g.GPUInstanceProfiles) == 0 {
		f.add("mig.gpuInstanceProfiles", "empty")
	}
	ids, idxs, names := map[int]bool{}, map[int]bool{}, map[string]bool{}
	for i := range g.GPUInstanceProfiles {
		p := &g.GPUInstanceProfiles[i]
		fld := fmt.Sprintf("mig.gpuInstanceProfiles[%d] (%s)", i, p.Name)
		if ids[p.ID] {
			f.add(fld+".id", "%d used by two profiles", p.ID)
		}
		ids[p.ID] = true
		if p.Index < 0 || p.Index >= gpuInstanceProfileCount {
			f.add(fld+".index", "%d must be 0..%d (NVML GPU_INSTANCE_PROFILE_*)", p.Index, gpuInstanceProfileCount-1)
		}
		if idxs[p.Index] {
			f.add(fld+".index", "%d used by two profiles", p.Index)
		}
		idxs[p.Index] = true
		if !giNameRE.MatchString(p.Name) {
			f.add(fld+".name", "%q is not of the form <n>g.<m>gb[+me|+me.all|-me|+gfx]", p.Name)
		}
		if names[p.Name] {
			f.add(fld+".name", "used by two profiles")
		}
		names[p.Name] = true
		if p.ComputeSlices <= 0 || p.ComputeSlices > g.ComputeSlices {
			f.add(fld+".computeSlices", "%d must be 1..%d", p.ComputeSlices, g.ComputeSlices)
		}
		if n, err := strconv.Atoi(strings.SplitN(p.Name, "g", 2)[0]); err == nil && n != p.ComputeSlices {
			f.add(fld+".computeSlices", "%d disagrees with the name %q", p.ComputeSlices, p.Name)
		}
		if p.Size <= 0 || p.Size > g.MemorySlices {
			f.add(fld+".size", "%d must be 1..%d memory slices", p.Size, g.MemorySlices)
			continue
		}
		if len(p.Placements) == 0 {
			f.add(fld+".placements", "empty")
		}
		prev := -1
		for _, s := range p.Placements {
			if s < 0 || s+p.Size > g.MemorySlices {
				f.add(fld+".placements", "start %d + size %d is outside the %d memory slices", s, p.Size, g.MemorySlices)
			}
			if s <= prev {
				f.add(fld+".placements", "starts must be strictly increasing (%d after %d)", s, prev)
			}
			prev = s
		}
		maxFit := maxDisjoint(p.Placements, p.Size)
		if p.MaxInstances <= 0 || p.MaxInstances > maxFit {
			f.add(fld+".maxInstances", "%d must be 1..%d (disjoint placements)", p.MaxInstances, maxFit)
		}
		if p.MemoryMiB == 0 || p.MemoryMiB > m.MemoryMiB {
			f.add(fld+".memoryMiB", "%d must be 1..%d (the GPU's memory)", p.MemoryMiB, m.MemoryMiB)
		}
		if p.MemoryMiB > 0 && p.MaxInstances > 0 && uint64(p.MaxInstances) > m.MemoryMiB/p.MemoryMiB {
			f.add(fld+".memoryMiB", "%d x maxInstances %d exceeds the GPU's %d MiB", p.MemoryMiB, p.MaxInstances, m.MemoryMiB)
		}
		if p.SMs <= 0 || p.SMs > m.SMs {
			f.add(fld+".sms", "%d must be 1..%d", p.SMs, m.SMs)
		}
		if p.Media && p.MaxInstances != 1 {
			f.add(fld+".maxInstances", "a media (+me) profile is limited to 1 instance, got %d", p.MaxInstances)
		}
	}
	sets := map[int]bool{}
	for i, s := range g.ComputeInstanceProfiles {
		fld := fmt.Sprintf("mig.computeInstanceProfiles[%d] (giSlices %d)", i, s.GISlices)
		if s.GISlices <= 0 || s.GISlices > g.ComputeSlices {
			f.add(fld+".giSlices", "%d must be 1..%d", s.GISlices, g.ComputeSlices)
		}
		// ComputeInstanceProfiles(n) returns the first set: a second one would be ignored.
		if sets[s.GISlices] {
			f.add(fld+".giSlices", "%d listed twice", s.GISlices)
		}
		sets[s.GISlices] = true
		seen := map[int]bool{}
		full := false
		for j, c := range s.Profiles {
			cf := fmt.Sprintf("%s.profiles[%d]", fld, j)
			if seen[c.ID] {
				f.add(cf+".id", "%d used twice", c.ID)
			}
			seen[c.ID] = true
			if c.Slices <= 0 || c.Slices > s.GISlices {
				f.add(cf+".slices", "%d must be 1..%d", c.Slices, s.GISlices)
			} else if c.MaxInstances <= 0 || c.MaxInstances > s.GISlices/c.Slices {
				f.add(cf+".maxInstances", "%d x %d slices does not fit %d slices", c.MaxInstances, c.Slices, s.GISlices)
			}
			if c.Slices == s.GISlices {
				full = true
			}
		}
		if !full {
			f.add(fld, "no compute-instance profile covers the whole GPU instance")
		}
	}
	for i := range g.GPUInstanceProfiles {
		p := &g.GPUInstanceProfiles[i]
		if m.ComputeInstanceProfiles(p.ComputeSlices) == nil {
			f.add(fmt.Sprintf("mig.gpuInstanceProfiles[%d] (%s)", i, p.Name), "no computeInstanceProfiles entry for giSlices %d", p.ComputeSlices)
		}
	}
}

// maxDisjoint returns how many non-overlapping instances of size the starts allow.
func maxDisjoint(starts []int, size int) int {
	n, end := 0, -1
	for _, s := range starts {
		if s >= end {
			n++
			end = s + size
		}
	}
	return n
}

func (m *Model) validateVGPU(f *fieldErrs) {
	v := m.VGPU
	if len(v.Flows) == 0 {
		f.add("vgpu.flows", "at least one of mdev, vfio")
	}
	for i, fl := range v.Flows {
		if fl != FlowMdev && fl != FlowVFIO {
			f.add(fmt.Sprintf("vgpu.flows[%d]", i), "%q is not mdev or vfio", fl)
		}
	}
	vfio := false
	for _, fl := range v.Flows {
		vfio = vfio || fl == FlowVFIO
	}
	if v.SRIOVVFs < 0 {
		f.add("vgpu.sriovVFs", "%d must not be negative", v.SRIOVVFs)
	} else if vfio && v.SRIOVVFs == 0 {
		f.add("vgpu.sriovVFs", "the vfio flow needs SR-IOV virtual functions")
	}
	if v.TypePrefix == "" {
		f.add("vgpu.typePrefix", "missing")
	}
	if len(v.Types) == 0 {
		f.add("vgpu.types", "empty")
	}
	ids, names := map[int]bool{}, map[string]bool{}
	for i := range v.Types {
		t := &v.Types[i]
		fld := fmt.Sprintf("vgpu.types[%d] (%s)", i, t.Name)
		if t.ID <= 0 {
			f.add(fld+".id", "must be positive")
		}
		if ids[t.ID] {
			f.add(fld+".id", "%d used by two types", t.ID)
		}
		ids[t.ID] = true
		if !typeNameRE.MatchString(t.Name) {
			f.add(fld+".name", "%q is not a vGPU type name like L4-4Q or H100XM-3-40C", t.Name)
		}
		if names[t.Name] {
			f.add(fld+".name", "used by two types")
		}
		names[t.Name] = true
		switch t.Series {
		case SeriesQ, SeriesB, SeriesA, SeriesC:
			if !strings.Contains(t.Name, t.Series) {
				f.add(fld+".series", "%q does not appear in the name", t.Series)
			}
		default:
			f.add(fld+".series", "%q is not Q, B, A or C", t.Series)
		}
		if t.FramebufferMiB == 0 || t.FramebufferMiB > m.MemoryMiB {
			f.add(fld+".framebufferMiB", "%d must be 1..%d", t.FramebufferMiB, m.MemoryMiB)
		}
		if t.MaxInstances <= 0 {
			f.add(fld+".maxInstances", "must be positive")
		}
		if t.MaxInstancesMixed < 0 || t.MaxInstancesMixed > t.MaxInstances {
			f.add(fld+".maxInstancesMixed", "%d must be 0..maxInstances (%d)", t.MaxInstancesMixed, t.MaxInstances)
		}
		// On an SR-IOV GPU each VF holds at most one vGPU, with either flow
		// (reference 1.1 and 2.2), so the VFs bound every type.
		if v.SRIOVVFs > 0 && t.MaxInstances > v.SRIOVVFs {
			f.add(fld+".maxInstances", "%d exceeds the %d SR-IOV VFs", t.MaxInstances, v.SRIOVVFs)
		}
		for j, fl := range t.Flows {
			if fl != FlowMdev && fl != FlowVFIO {
				f.add(fmt.Sprintf("%s.flows[%d]", fld, j), "%q is not mdev or vfio", fl)
			} else if !slices.Contains(v.Flows, fl) {
				f.add(fmt.Sprintf("%s.flows[%d]", fld, j), "%q is not one of the model's flows %v", fl, v.Flows)
			}
		}
		if t.MaxResolution != "" && !resRE.MatchString(t.MaxResolution) {
			f.add(fld+".maxResolution", "%q is not WxH", t.MaxResolution)
		}
		if !t.MIGBacked() {
			if t.MaxPerGPUInstance != 0 {
				f.add(fld+".maxPerGPUInstance", "only for MIG-backed types")
			}
			if t.FramebufferMiB > 0 && t.MaxInstances > 0 && uint64(t.MaxInstances) > m.MemoryMiB/t.FramebufferMiB {
				f.add(fld+".maxInstances", "%d x %d MiB exceeds the GPU's %d MiB", t.MaxInstances, t.FramebufferMiB, m.MemoryMiB)
			}
			continue
		}
		gi, ok := m.GPUInstanceProfileByID(*t.GPUInstanceProfile)
		if !ok {
			f.add(fld+".gpuInstanceProfile", "%d is not a GPU-instance profile id of this model", *t.GPUInstanceProfile)
			continue
		}
		if t.MaxPerGPUInstance <= 0 {
			f.add(fld+".maxPerGPUInstance", "a MIG-backed type needs it")
			continue
		}
		// ceil(maxInstances / GIs) > maxPerGPUInstance, without a product that could overflow.
		if gi.MaxInstances > 0 && t.MaxInstances > 0 && (t.MaxInstances-1)/gi.MaxInstances >= t.MaxPerGPUInstance {
			f.add(fld+".maxInstances", "%d exceeds maxPerGPUInstance %d x %d instances of %s", t.MaxInstances, t.MaxPerGPUInstance, gi.MaxInstances, gi.Name)
		}
		if t.Series != SeriesC && m.hasGraphicsProfiles() && !gi.Graphics {
			f.add(fld+".gpuInstanceProfile", "graphics type %s needs a +gfx GPU-instance profile, %s is not", t.Name, gi.Name)
		}
	}
}

func (m *Model) hasGraphicsProfiles() bool {
	if m.MIG == nil {
		return false
	}
	for _, p := range m.MIG.GPUInstanceProfiles {
		if p.Graphics {
			return true
		}
	}
	return false
}
