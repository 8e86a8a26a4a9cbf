package sim

import (
	"slices"
	"sort"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/profile"
)

// This file holds the driver's rules, shared by the NVML and sysfs views.

// giIDFor is the driver's fixed (size, start) -> GPU-instance id table
// ("swizzle id", reference 3.4): ids are assigned by size class, largest
// first; within the half-GPU class the upper half gets the lower id.
func giIDFor(m *profile.Model, size, start int) int {
	var sizes []int
	seen := map[int]bool{}
	for _, p := range m.MIG.GPUInstanceProfiles {
		if !seen[p.Size] {
			seen[p.Size] = true
			sizes = append(sizes, p.Size)
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(sizes)))
	offset := 0
	for _, s := range sizes {
		n := m.MIG.MemorySlices / s
		if s == size {
			pos := start / s
			if n == 2 {
				pos = 1 - pos
			}
			return offset + pos
		}
		offset += n
	}
	return offset + start
}

// giCreate applies the placement legality model (reference 3.2): the start
// must be legal for the profile, the range must not overlap an existing GI
// and the per-profile count must not be exhausted. An illegal start is a
// bad argument whatever the GPU holds (INVALID_ARGUMENT, reference 3.7),
// so it is checked before the resources (INSUFFICIENT_RESOURCES).
func giCreate(g *gpuState, p *profile.GPUInstanceProfile, start int, explicit bool) (*gi, nvml.Return) {
	if !g.MIGCurrent {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	if explicit && !slices.Contains(p.Placements, start) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	count := 0
	for _, x := range g.GIs {
		if x.ProfileID == p.ID {
			count++
		}
	}
	if count >= p.MaxInstances {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	free := func(s int) bool {
		r := gpu.Range{Start: s, Size: p.Size}
		for _, x := range g.GIs {
			if r.Overlaps(gpu.Range{Start: x.Start, Size: x.Size}) {
				return false
			}
		}
		return true
	}
	if explicit {
		if !free(start) {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
	} else {
		// Without a placement the driver's choice is undocumented; the
		// simulator takes the lowest free legal start (first fit).
		start = -1
		for _, s := range p.Placements {
			if free(s) {
				start = s
				break
			}
		}
		if start < 0 {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
	}
	x := &gi{ID: giIDFor(g.model, p.Size, start), ProfileID: p.ID, Start: start, Size: p.Size}
	g.GIs = append(g.GIs, x)
	sort.Slice(g.GIs, func(i, j int) bool { return g.GIs[i].ID < g.GIs[j].ID })
	return x, nvml.SUCCESS
}

// giRemaining is GetGpuInstanceRemainingCapacity: how many more instances
// of p fit now.
func giRemaining(g *gpuState, p *profile.GPUInstanceProfile) int {
	count := 0
	var used []gpu.Range
	for _, x := range g.GIs {
		if x.ProfileID == p.ID {
			count++
		}
		used = append(used, gpu.Range{Start: x.Start, Size: x.Size})
	}
	n, end := 0, -1
	for _, s := range p.Placements {
		r := gpu.Range{Start: s, Size: p.Size}
		if s < end {
			continue
		}
		ok := true
		for _, u := range used {
			if r.Overlaps(u) {
				ok = false
				break
			}
		}
		if ok {
			n++
			end = r.End()
		}
	}
	if left := p.MaxInstances - count; n > left {
		n = left
	}
	return n
}

func (g *gpuState) vgpusOnGI(id int) []*vgpu {
	var out []*vgpu
	for _, v := range g.vgpus() {
		if v.GI == id {
			out = append(out, v)
		}
	}
	return out
}

func (g *gpuState) typeOf(v *vgpu) *profile.VGPUType {
	t, _ := g.model.VGPUTypeByID(v.Type)
	return t
}

// room is how many more vGPUs of type t the driver would create on g now,
// before counting free VFs or mdev parents.
func room(g *gpuState, t *profile.VGPUType, opts Options) int {
	if g.Lost || !g.model.HasFlow(t, g.Flavour) {
		return 0
	}
	if t.MIGBacked() {
		if !g.MIGCurrent {
			return 0
		}
		n := 0
		for _, x := range g.GIs {
			// A GPU instance whose compute instances serve the host (a
			// plain MIG instance) takes no vGPU [inferred: reference 2.7
			// asks for a free GI of the type's profile].
			if x.ProfileID != *t.GPUInstanceProfile || len(x.CIs) > 0 {
				continue
			}
			on := g.vgpusOnGI(x.ID)
			// A GPU instance hosts vGPUs of one framebuffer size.
			if len(on) > 0 && g.typeOf(on[0]).FramebufferMiB != t.FramebufferMiB {
				continue
			}
			if r := t.MaxPerGPUInstance - len(on); r > 0 {
				n += r
			}
		}
		return n
	}
	if g.MIGCurrent {
		return 0
	}
	var sliced []*vgpu
	for _, v := range g.vgpus() {
		if v.GI < 0 {
			sliced = append(sliced, v)
		}
	}
	if !g.Heterogeneous {
		for _, v := range sliced {
			u := g.typeOf(v)
			if u.ID != t.ID && !(opts.MixSeries && u.FramebufferMiB == t.FramebufferMiB) {
				return 0
			}
		}
		return t.MaxInstances - len(sliced)
	}
	var fb uint64
	same := 0
	for _, v := range sliced {
		u := g.typeOf(v)
		fb += u.FramebufferMiB
		if u.ID == t.ID {
			same++
		}
	}
	r := t.MixedMax() - same
	if byFB := int((g.model.MemoryMiB - fb) / t.FramebufferMiB); byFB < r {
		r = byFB
	}
	if hetPlacement(g, t) < 0 && r > 0 {
		r = 0
	}
	return r
}

// hetPlacement is the mixed-size placement the driver would give a new
// vGPU of type t: framebuffer slots of 1 GiB, a type occupying
// framebuffer/1GiB slots at an offset that is a multiple of its size,
// lowest free first. -1 when none is free.
func hetPlacement(g *gpuState, t *profile.VGPUType) int {
	const slotMiB = 1024
	size := int((t.FramebufferMiB + slotMiB - 1) / slotMiB)
	slots := int(g.model.MemoryMiB / slotMiB)
	var used []gpu.Range
	for _, v := range g.vgpus() {
		if v.GI < 0 && v.Placement >= 0 {
			u := g.typeOf(v)
			used = append(used, gpu.Range{Start: v.Placement, Size: int((u.FramebufferMiB + slotMiB - 1) / slotMiB)})
		}
	}
	for s := 0; s+size <= slots; s += size {
		r := gpu.Range{Start: s, Size: size}
		ok := true
		for _, u := range used {
			if r.Overlaps(u) {
				ok = false
				break
			}
		}
		if ok {
			return s
		}
	}
	return -1
}

// createVGPU makes the driver's vGPU record for type t on g, choosing the
// GPU instance for a MIG-backed type (the driver picks it, reference 2.7:
// here the GI already hosting this size with room, else the lowest id).
func (st *state) createVGPU(g *gpuState, t *profile.VGPUType) *vgpu {
	v := &vgpu{Handle: st.NextHandle, Type: t.ID, GI: -1, Placement: -1}
	st.NextHandle++
	v.UUID = hashUUID("vgpu:" + g.UUID + ":" + strconv.FormatUint(uint64(v.Handle), 10))
	if t.MIGBacked() {
		best := -1
		bestUsed := -1
		for _, x := range g.GIs {
			if x.ProfileID != *t.GPUInstanceProfile || len(x.CIs) > 0 {
				continue
			}
			on := g.vgpusOnGI(x.ID)
			if len(on) >= t.MaxPerGPUInstance || (len(on) > 0 && g.typeOf(on[0]).FramebufferMiB != t.FramebufferMiB) {
				continue
			}
			if len(on) > bestUsed {
				best, bestUsed = x.ID, len(on)
			}
		}
		v.GI = best
		v.Placement = bestUsed
		if x := g.giByID(best); x != nil {
			v.Placement = x.Start*t.MaxPerGPUInstance + bestUsed
		}
	} else if g.Heterogeneous {
		v.Placement = hetPlacement(g, t)
	}
	return v
}

// freeVFs counts VFs without a vGPU.
func (g *gpuState) freeVFs() int {
	n := 0
	for _, v := range g.VFs {
		if v.VGPU == nil {
			n++
		}
	}
	return n
}

// creatableTypes lists the types creatable on the GPU now (NVML's
// GetCreatableVgpus): room left and, for vendor VFIO, a free VF.
func creatableTypes(g *gpuState, opts Options) []*profile.VGPUType {
	if g.model.VGPU == nil || g.Flavour == string(gpu.FlavourNone) {
		return nil
	}
	var out []*profile.VGPUType
	for i := range g.model.VGPU.Types {
		t := &g.model.VGPU.Types[i]
		if room(g, t, opts) <= 0 {
			continue
		}
		if g.Flavour == string(gpu.FlavourVFIO) && g.freeVFs() == 0 {
			continue
		}
		if g.Flavour == string(gpu.FlavourMdev) && !g.mdevParentsArePFs() && g.freeMdevVFs() == 0 {
			continue
		}
		out = append(out, t)
	}
	return out
}

// mdevParentsArePFs: on non-SR-IOV GPUs the PF is the mdev parent; on
// SR-IOV GPUs (Ampere and later) each VF is a parent holding at most one vGPU.
func (g *gpuState) mdevParentsArePFs() bool {
	return g.model.VGPU == nil || g.model.VGPU.SRIOVVFs == 0
}

func (g *gpuState) mdevOn(parent string) *mdv {
	for _, m := range g.Mdevs {
		if m.Parent == parent {
			return m
		}
	}
	return nil
}

func (g *gpuState) freeMdevVFs() int {
	n := 0
	for _, v := range g.VFs {
		if g.mdevOn(v.PCI) == nil {
			n++
		}
	}
	return n
}

// mdevAvailable is available_instances of type t under parent.
func mdevAvailable(g *gpuState, parent string, t *profile.VGPUType, opts Options) int {
	return availableFrom(g, parent, room(g, t, opts))
}

// availableFrom turns the GPU's room for a type into one parent's
// available_instances: a VF parent holds at most one vGPU.
func availableFrom(g *gpuState, parent string, r int) int {
	if r <= 0 {
		return 0
	}
	if g.mdevParentsArePFs() {
		return r
	}
	if g.mdevOn(parent) != nil {
		return 0
	}
	return 1
}

// mdevParents lists the mdev parents of g (PF or VFs).
func (g *gpuState) mdevParents() []string {
	if g.Flavour != string(gpu.FlavourMdev) || g.model.VGPU == nil {
		return nil
	}
	if g.mdevParentsArePFs() {
		return []string{g.PCI}
	}
	var out []string
	for _, v := range g.VFs {
		out = append(out, v.PCI)
	}
	return out
}

// activeVGPUs are the vGPUs a VM has open (NVML lists only these).
func (g *gpuState) activeVGPUs() []*vgpu {
	var out []*vgpu
	for _, v := range g.vgpus() {
		if v.VM != "" {
			out = append(out, v)
		}
	}
	return out
}
