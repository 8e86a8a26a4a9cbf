package apply

import (
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"strings"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// gpuPlan is one GPU as the change set leaves it: what stays and what the
// creates add.
type gpuPlan struct {
	g    manager.GPUView
	mig  bool // MIG mode once the mode changes are done
	stay []manager.InstanceView
	// going are the instances on the GPU that the change set (or another
	// caller) destroys: what they hold is free once the destroys are done.
	going []manager.InstanceView
	want  map[string]int // creates by canonical profile name
	info  map[string]manager.ProfileInfo
	order []string
	// ciWant counts the compute-instance creates by (profile, tenant):
	// a tenant's compute instances share its GPU instances. ciOrder
	// lists its keys in the creates' order.
	ciWant  map[key]int
	ciOrder []key
}

func (p *gpuPlan) name() string { return fmt.Sprintf("GPU %s (%s)", p.g.PCI, p.g.Model) }

func (p *gpuPlan) wanted(kind store.InstanceKind) (names []string, n int) {
	for _, name := range p.order {
		if store.InstanceKind(p.info[name].Kind) == kind {
			names = append(names, name)
			n += p.want[name]
		}
	}
	return names, n
}

func (p *gpuPlan) list(names []string) string {
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s×%d", n, p.want[n])
	}
	return strings.Join(parts, ", ")
}

func (p *gpuPlan) check(h *host, pr *problems) {
	total := 0
	for _, n := range p.want {
		total += n
	}
	switch {
	case p.g.Lost || p.g.State == gpu.StateLost:
		pr.add(manager.ErrGPULost, "%s is lost; the %d instances to create there cannot be made", p.name(), total)
		return
	case p.g.State == gpu.StateFailed:
		pr.add(manager.ErrNoCapacity, "%s takes no new instance: failed: %s; the change set creates %d there", p.name(), p.g.Reason, total)
		return
	}
	for _, in := range p.stay {
		if in.Kind == store.KindPassthrough {
			pr.add(manager.ErrNoCapacity, "%s is passed through whole (instance %s stays); the change set creates %d there", p.name(), in.UUID, total)
			return
		}
	}
	// The MIG mode once the mode changes are done decides which kinds fit:
	// the manager places MIG instances and MIG-backed vGPUs only with MIG
	// on, time-sliced vGPUs only with it off.
	migNames, migN := p.wanted(store.KindMIG)
	mbNames, mbN := p.wanted(store.KindMIGVGPU)
	tsNames, tsN := p.wanted(store.KindVGPU)
	switch {
	case !p.mig && migN+mbN > 0:
		pr.add(manager.ErrInvalidArgument, "%s has MIG off once the change set's mode changes are done, but %s need it on",
			p.name(), p.list(append(migNames, mbNames...)))
		return
	case p.mig && tsN > 0:
		pr.add(manager.ErrInvalidArgument, "%s has MIG on once the change set's mode changes are done, but the time-sliced %s need it off",
			p.name(), p.list(tsNames))
		return
	}
	p.checkPassthrough(h, total, pr)
	if !p.mig {
		p.checkTimeSliced(h, pr)
	} else {
		p.checkMIG(h, pr)
	}
	p.checkDevices(pr)
}

// checkPassthrough: a whole GPU goes to one instance, and only when
// nothing else lives on it.
func (p *gpuPlan) checkPassthrough(h *host, total int, pr *problems) {
	if p.want[manager.ProfilePassthrough] == 0 {
		return
	}
	n := p.want[manager.ProfilePassthrough]
	if n > 1 {
		pr.add(manager.ErrNoCapacity, "%s: passthrough×%d wanted, 1 possible (a GPU passes through once)", p.name(), n)
		return
	}
	var held []string
	if others := total - n; others > 0 {
		var names []string
		for _, name := range p.order {
			if name != manager.ProfilePassthrough {
				names = append(names, name)
			}
		}
		held = append(held, "new "+p.list(names))
	}
	if len(p.stay) > 0 {
		held = append(held, fmt.Sprintf("%d instances that stay", len(p.stay)))
	}
	if f := foreignLeft(p.g, h.insts); f > 0 {
		held = append(held, fmt.Sprintf("%d devices vgpud did not create", f))
	}
	if len(held) > 0 {
		pr.add(manager.ErrNoCapacity, "%s: passthrough needs the GPU free of instances, but it would hold %s", p.name(), strings.Join(held, ", "))
	}
}

// checkTimeSliced: a homogeneous GPU holds one type, at most the type's
// per-GPU maximum of it; a heterogeneous one at most its framebuffer.
func (p *gpuPlan) checkTimeSliced(h *host, pr *problems) {
	names, n := p.wanted(store.KindVGPU)
	if n == 0 {
		return
	}
	stay := map[string]int{}
	var stayFB uint64
	for _, in := range p.stay {
		if in.Kind != store.KindVGPU {
			continue
		}
		info, _, ok := h.resolve(p.g.Model, in.TypeName)
		if !ok || store.InstanceKind(info.Kind) != store.KindVGPU {
			continue
		}
		stay[info.Name]++
		// The manager sums the framebuffer of the types the GPU offers in
		// its flavour only.
		if slices.Contains(strings.Split(info.Flows, ","), string(p.g.VGPU.Flavour)) {
			stayFB += info.VRAMBytes
		}
	}
	if p.g.VGPU.Heterogeneous {
		mem := uint64(0)
		for _, q := range h.profiles[p.g.Model] {
			if q.Kind == string(store.KindPassthrough) {
				mem = q.VRAMBytes
			}
		}
		need := stayFB
		for _, name := range names {
			need += uint64(p.want[name]) * p.info[name].VRAMBytes
		}
		if mem > 0 && need > mem {
			pr.add(manager.ErrNoCapacity, "%s: %s wanted beside the vGPUs that stay need %s of framebuffer; the GPU has %s (%s free)",
				p.name(), p.list(names), tenant.FormatBytes(need), tenant.FormatBytes(mem), tenant.FormatBytes(mem-min(mem, stayFB)))
		}
		return
	}
	types := map[string]bool{}
	for _, name := range names {
		types[name] = true
	}
	for name, k := range stay {
		if k > 0 {
			types[name] = true
		}
	}
	if len(types) > 1 {
		var have []string
		for _, name := range sortedNames(stay) {
			have = append(have, fmt.Sprintf("%s×%d", name, stay[name]))
		}
		what := "new " + p.list(names)
		if len(have) > 0 {
			what += " beside " + strings.Join(have, ", ") + " that stay"
		}
		pr.add(manager.ErrNoCapacity, "%s is in homogeneous vGPU mode (one type per GPU), but would hold %s", p.name(), what)
		return
	}
	t := names[0]
	if max := p.info[t].MaxPerGPU; max > 0 && stay[t]+p.want[t] > max {
		pr.add(manager.ErrNoCapacity, "%s: %s×%d wanted, at most %d fit (the type's maximum per GPU is %d, %d stay)",
			p.name(), t, p.want[t], max-min(max, stay[t]), max, stay[t])
	}
}

// checkMIG: the new GPU instances must have a placement on the GPU's grid
// beside those that stay, within each profile's per-GPU maximum. Compute
// instances count as the GPU instances they need at least (giDemand).
func (p *gpuPlan) checkMIG(h *host, pr *problems) {
	if _, n := p.wanted(store.KindMIG); n == 0 {
		return
	}
	want, names, notes := p.giDemand(h)
	if len(names) == 0 {
		return
	}
	list := func() string {
		parts := make([]string, len(names))
		for i, n := range names {
			parts[i] = fmt.Sprintf("%s×%d", n, want[n])
		}
		return strings.Join(parts, ", ")
	}
	fit := newMIGFit(p.g)
	ids := map[string]int{}
	maxOf := map[int]int{}
	for _, q := range p.g.MIG.Profiles {
		if q.Name != "" {
			ids[q.Name] = q.ID
		}
		maxOf[q.ID] = q.MaxInstances
	}
	occupied, count := p.migHeld()
	// The per-GPU maxima first: NVML reports them even where it does not
	// report the grid.
	for _, name := range names {
		id, known := ids[name]
		if !known {
			continue
		}
		if k, max := want[name], maxOf[id]; max > 0 && count[id]+k > max {
			pr.add(manager.ErrNoCapacity, "%s: %s×%d wanted, at most %d fit (the profile's maximum per GPU is %d, %d stay)%s",
				p.name(), name, k, max-min(max, count[id]), max, count[id], noteList(notes))
			return
		}
	}
	var grid slotMask
	for _, ms := range fit.placements {
		for _, m := range ms {
			grid |= m
		}
	}
	for _, name := range names {
		if len(fit.placements[name]) == 0 {
			return // the grid as NVML reports it does not know the profile
		}
	}
	var needs []string
	sizes := 0
	for _, name := range names {
		k := want[name]
		for range k {
			needs = append(needs, name)
		}
		sizes += k * minSize(fit.placements[name])
	}
	free := bits.OnesCount64(uint64(grid &^ occupied))
	// The slice count first: it bounds the search below to a grid's worth.
	if sizes <= free && fit.feasible(occupied, needs) {
		return
	}
	why := fmt.Sprintf("they need %d slices and %d of its %d are free", sizes, free, bits.OnesCount64(uint64(grid)))
	if sizes <= free {
		why = fmt.Sprintf("%d of its %d slices are free, but no placement of them all fits there", free, bits.OnesCount64(uint64(grid)))
	}
	var alone []string
	for _, name := range names {
		k := 0
		for k < want[name] && fit.feasible(occupied, repeatName(name, k+1)) {
			k++
		}
		alone = append(alone, fmt.Sprintf("%s×%d", name, k))
	}
	pr.add(manager.ErrNoCapacity, "%s: %s wanted do not fit beside the GPU instances that stay: %s (each profile on its own, at most %s fit)%s",
		p.name(), list(), why, strings.Join(alone, ", "), noteList(notes))
}

func noteList(notes []string) string {
	if len(notes) == 0 {
		return ""
	}
	return "; " + strings.Join(notes, "; ")
}

// giDemand is what the MIG creates need of the GPU, in new GPU instances
// by GPU-instance profile, in the creates' order: a GPU-instance create is
// one; compute instances, which the manager packs into GPU instances of
// their tenant, need at least as many new ones as hold what the tenant's
// GPU instances that stay have no room for, by compute slices and by the
// compute-instance profile's maximum per GPU instance. That is a lower
// bound (starts inside a GPU instance are aligned, so the manager may need
// more), so the check refuses nothing the creates could carry out. notes
// say where compute instances' GPU instances come from.
func (p *gpuPlan) giDemand(h *host) (want map[string]int, order []string, notes []string) {
	want = map[string]int{}
	add := func(name string, n int) {
		if n <= 0 {
			return
		}
		if want[name] == 0 {
			order = append(order, name)
		}
		want[name] += n
	}
	type group struct{ tenant, gi string }
	var groups []group
	cis := map[group][]string{}
	for _, name := range p.order {
		info := p.info[name]
		if store.InstanceKind(info.Kind) != store.KindMIG {
			continue
		}
		if info.GPUInstance == "" {
			add(name, p.want[name])
			continue
		}
		for _, k := range p.ciOrder {
			if k.profile != name {
				continue
			}
			g := group{k.tenant, info.GPUInstance}
			if cis[g] == nil {
				groups = append(groups, g)
			}
			cis[g] = append(cis[g], name)
		}
	}
	giNames := map[int]string{}
	for _, q := range p.g.MIG.Profiles {
		giNames[q.ID] = q.Name
	}
	for _, g := range groups {
		giInfo, ok := match(h.profiles[p.g.Model], g.gi)
		if !ok || giInfo.ComputeSlices <= 0 {
			continue
		}
		// Room in the tenant's GPU instances of that profile that stay
		// and hold only its compute instances (the manager adds to those).
		type room struct {
			used  int
			count map[string]int
		}
		rooms := map[[2]int]*room{}
		shared := map[[2]int]bool{}
		for _, in := range p.stay {
			if in.Kind != store.KindMIG && in.Kind != store.KindMIGVGPU {
				continue
			}
			k := [2]int{in.GIStart, in.GIProfileID}
			if giNames[in.GIProfileID] != g.gi {
				continue
			}
			r := rooms[k]
			if r == nil {
				r = &room{count: map[string]int{}}
				rooms[k] = r
				shared[k] = true
			}
			if in.Kind != store.KindMIG || in.CISlices == 0 || in.Tenant != g.tenant || in.State == store.StateFailed {
				shared[k] = false
			}
			r.used += in.CISlices
			r.count[h.profileOf(in.Instance)]++
		}
		freeSlices := 0
		freeOf := map[string]int{}
		for k, r := range rooms {
			if !shared[k] {
				continue
			}
			freeSlices += max(0, giInfo.ComputeSlices-r.used)
			for _, name := range cis[g] {
				freeOf[name] += max(0, p.info[name].PerGPUInstance-r.count[name])
			}
		}
		slicesNeeded, need := 0, 0
		var asked []string
		for _, name := range cis[g] {
			info, k := p.info[name], p.ciWant[key{name, g.tenant}]
			slicesNeeded += k * info.ComputeSlices
			if per := info.PerGPUInstance; per > 0 {
				need = max(need, ceilDiv(k-freeOf[name], per))
			}
			asked = append(asked, fmt.Sprintf("%s×%d", name, k))
		}
		need = max(need, ceilDiv(slicesNeeded-freeSlices, giInfo.ComputeSlices))
		if need > 0 {
			add(g.gi, need)
			notes = append(notes, fmt.Sprintf("compute instances %s of tenant %s need at least %d new %s", strings.Join(asked, ", "), g.tenant, need, g.gi))
		}
	}
	return want, order, notes
}

// ceilDiv is ⌈a/b⌉ for b > 0, and 0 for a ≤ 0.
func ceilDiv(a, b int) int {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

// migHeld is what the GPU instances that stay hold: the slices and the
// count per GPU-instance profile id. A GPU instance is freed when no
// instance that stays lives on it and one that goes did; one no record
// explains stays. Records whose GPU instance the host does not show (being
// created, or lost in a reboot) keep their slices, as the manager's
// placement keeps them.
func (p *gpuPlan) migHeld() (slotMask, map[int]int) {
	var occ slotMask
	count := map[int]int{}
	staying := map[[2]int][]manager.InstanceView{}
	for _, in := range p.stay {
		if in.Kind == store.KindMIG || in.Kind == store.KindMIGVGPU {
			k := [2]int{in.GIStart, in.GIProfileID}
			staying[k] = append(staying[k], in)
		}
	}
	leaving := map[[2]int]bool{}
	for _, in := range p.going {
		if in.Kind == store.KindMIG || in.Kind == store.KindMIGVGPU {
			leaving[[2]int{in.GIStart, in.GIProfileID}] = true
		}
	}
	shown := map[[2]int]bool{}
	for _, gi := range p.g.MIG.Instances {
		k := [2]int{gi.Placement.Start, gi.ProfileID}
		shown[k] = true
		if len(staying[k]) == 0 && leaving[k] {
			continue
		}
		occ |= rangeMask(gi.Placement.Start, gi.Placement.Size)
		count[gi.ProfileID]++
	}
	for k, ins := range staying {
		if !shown[k] && ins[0].GISize > 0 {
			occ |= rangeMask(k[0], ins[0].GISize)
			count[k[1]]++
		}
	}
	return occ, count
}

// checkDevices: each vGPU needs a VF (vendor VFIO) or an mdev parent of
// its own (legacy mdev on VF parents).
func (p *gpuPlan) checkDevices(pr *problems) {
	_, ts := p.wanted(store.KindVGPU)
	_, mb := p.wanted(store.KindMIGVGPU)
	n := ts + mb
	if n == 0 {
		return
	}
	held := map[string]bool{} // VFs and mdev parents of instances that stay
	for _, in := range p.stay {
		held[in.VF], held[in.MdevParent] = true, true
	}
	freed := map[string]bool{} // VFs and mdevs of instances that go
	for _, in := range p.going {
		freed[in.VF], freed[in.MdevUUID] = true, true
	}
	switch p.g.VGPU.Flavour {
	case gpu.FlavourVFIO:
		free := 0
		for _, vf := range p.g.VGPU.VFs {
			// A VF holding a vGPU no record explains stays taken.
			if vf.PCI != "" && !held[vf.PCI] && (vf.Type == 0 || freed[vf.PCI]) {
				free++
			}
		}
		if n > free {
			pr.add(manager.ErrNoCapacity, "%s: %d vGPUs wanted need a VF each; %d of its %d VFs are free once the destroys are done (the others hold vGPUs that stay)",
				p.name(), n, free, len(p.g.VGPU.VFs))
		}
	case gpu.FlavourMdev:
		free := 0
		for _, par := range p.g.VGPU.MdevParents {
			if par.PCI == p.g.PCI {
				return // the GPU itself is the parent: the types' own limits apply
			}
			busy := held[par.PCI]
			for _, md := range p.g.VGPU.Mdevs {
				if md.Parent == par.PCI && !freed[md.UUID] {
					busy = true
				}
			}
			if !busy {
				free++
			}
		}
		if n > free {
			pr.add(manager.ErrNoCapacity, "%s: %d vGPUs wanted need an mdev parent each; %d of its %d parents are free once the destroys are done",
				p.name(), n, free, len(p.g.VGPU.MdevParents))
		}
	}
}

func minSize(ms []slotMask) int {
	best := 0
	for i, m := range ms {
		if n := bits.OnesCount64(uint64(m)); i == 0 || n < best {
			best = n
		}
	}
	return best
}

func repeatName(name string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = name
	}
	return out
}

func sortedNames(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
