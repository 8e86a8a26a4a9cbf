package apply

import (
	"errors"
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

// DefaultMaxChanges is the most changes one document may make when Limits
// does not say: a layout for a large host is a few hundred changes, and a
// document far beyond that is more likely a generated mistake than a plan.
const DefaultMaxChanges = 1024

// Limits bound what one document may ask of the host. The zero value
// takes the defaults.
type Limits struct {
	// MaxChanges is the most changes one change set may hold; 0 means
	// DefaultMaxChanges. The daemon sets it from applyMaxChanges in
	// vgpud.yaml.
	MaxChanges int
}

func (l Limits) maxChanges() int {
	if l.MaxChanges > 0 {
		return l.MaxChanges
	}
	return DefaultMaxChanges
}

// checkSize refuses a change set larger than the limit, before any of it
// is checked against the host or carried out.
func checkSize(cs ChangeSet, lim Limits) error {
	if n, max := len(cs.Changes), lim.maxChanges(); n > max {
		return &PreflightError{Source: cs.Source, Config: cs.Config, Kind: manager.ErrInvalidArgument, Problems: []string{fmt.Sprintf(
			"the document asks for %d changes, more than the %d one apply may make; split it into smaller documents, "+
				"or raise applyMaxChanges in /etc/vgpud/vgpud.yaml (Limits.MaxChanges for library callers)", n, max)}}
	}
	return nil
}

// PreflightError is a change set refused before its first change: the
// host, its store and its tenants are as they were. Problems says what
// does not fit, one line each; Kind is the manager's sentinel for the
// first of them (ErrNoCapacity, ErrQuotaExceeded, ...).
type PreflightError struct {
	Source   string   `json:"source,omitempty"`
	Config   string   `json:"config,omitempty"`
	Problems []string `json:"problems"`
	Kind     error    `json:"-"`
}

// maxShown bounds the problems an error message lists.
const maxShown = 8

func (e *PreflightError) Error() string {
	var b strings.Builder
	if e.Source != "" {
		b.WriteString(e.Source)
		if e.Config != "" {
			fmt.Fprintf(&b, " (config %s)", e.Config)
		}
		b.WriteString(": ")
	}
	b.WriteString("refused before any change (nothing was changed): ")
	shown := e.Problems
	if len(shown) > maxShown {
		shown = shown[:maxShown]
	}
	b.WriteString(strings.Join(shown, "; "))
	if n := len(e.Problems) - len(shown); n > 0 {
		fmt.Fprintf(&b, "; and %d more", n)
	}
	return b.String()
}

func (e *PreflightError) Unwrap() error { return e.Kind }

// preflight checks a whole change set against the host as h read it,
// before anything is done: that each GPU can hold what the creates put on
// it beside the instances that stay, and that each tenant's quota takes
// its creates. It refuses only change sets that cannot be carried out
// whatever placement chooses: every check is a limit the manager or the
// driver enforces on each create, and each is checked against an
// under-estimate of what stays on the GPU (devices apply cannot name are
// left out), so a change set it lets through may still fail at a step
// (placement order, a device the driver refuses, other callers meanwhile),
// and then Execute stops there as before. What it cannot check exactly:
//
//   - MIG-backed vGPUs: their GPU instances are chosen, and may be shared,
//     by the manager; only their VFs or mdev parents are counted.
//   - MIG slices of a GPU whose grid NVML does not report (a GPU whose MIG
//     mode this change set turns on): not checked. Where the grid is known,
//     the check is whether any placement of the new GPU instances fits
//     beside the ones that stay, not whether the manager finds it in the
//     order it creates them.
//   - Heterogeneous vGPU mode: only the framebuffer is summed; the types'
//     mixed-mode maximums are not known here.
//   - Devices vgpud did not create count against VFs and MIG slices, but not
//     against a vGPU type's count or a homogeneous GPU's type: the manager
//     names them by catalog type id, which apply does not see.
func preflight(h *host, cs ChangeSet) error {
	destroyed := map[string]bool{}
	modes := map[string]bool{}
	var creates []Change
	for _, c := range cs.Changes {
		switch c.Op {
		case OpDestroy:
			destroyed[c.Instance] = true
		case OpSetMIGMode:
			if g, ok := h.findGPU(gpuID(c)); ok && c.MIG != nil {
				modes[g.UUID] = *c.MIG
			}
		case OpCreate:
			creates = append(creates, c)
		}
	}
	if len(creates) == 0 {
		return nil
	}
	// In Execute's order, so the GPUs' problems are listed in the order
	// its creates would meet them.
	sortChanges(creates)
	var pr problems
	plans := map[string]*gpuPlan{}
	var gpus []string
	for _, c := range creates {
		g, ok := h.findGPU(gpuID(c))
		if !ok {
			pr.add(manager.ErrNotFound, "%s: no GPU %s on this host (run `vgpuctl gpus`)", c, gpuID(c))
			continue
		}
		p := plans[g.UUID]
		if p == nil {
			p = &gpuPlan{g: g, mig: g.MIG.Enabled, want: map[string]int{}, info: map[string]manager.ProfileInfo{}}
			if on, ok := modes[g.UUID]; ok {
				p.mig = on
			}
			plans[g.UUID] = p
			gpus = append(gpus, g.UUID)
		}
		info, _, ok := h.resolve(g.Model, c.Profile)
		if !ok {
			continue // the create itself refuses the name, before carving
		}
		if p.want[info.Name] == 0 {
			p.order = append(p.order, info.Name)
		}
		p.want[info.Name]++
		p.info[info.Name] = info
	}
	for _, id := range gpus {
		p := plans[id]
		for _, in := range h.insts {
			// An instance another caller is destroying is counted as gone:
			// the check must not refuse on room that frees up meanwhile.
			switch {
			case in.GPUUUID != id:
			case destroyed[in.UUID] || in.State == store.StateDestroying:
				p.going = append(p.going, in)
			default:
				p.stay = append(p.stay, in)
			}
		}
		p.check(h, &pr)
	}
	checkTenants(h, cs, destroyed, creates, &pr)
	if len(pr.lines) == 0 {
		return nil
	}
	return &PreflightError{Source: cs.Source, Config: cs.Config, Kind: pr.kind, Problems: pr.lines}
}

// problems collects what does not fit; the first one's sentinel names the
// refusal.
type problems struct {
	kind  error
	lines []string
}

func (p *problems) add(kind error, format string, args ...any) {
	if p.kind == nil {
		p.kind = kind
	}
	p.lines = append(p.lines, fmt.Sprintf(format, args...))
}

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
	case p.g.Lost || p.g.State == "lost":
		pr.add(manager.ErrGPULost, "%s is lost; the %d instances to create there cannot be made", p.name(), total)
		return
	case p.g.State == "failed":
		pr.add(manager.ErrNoCapacity, "%s takes no new instance: failed: %s; the change set creates %d there", p.name(), p.g.Reason, total)
		return
	}
	for _, in := range p.stay {
		if in.Kind == store.KindPassthrough {
			pr.add(manager.ErrNoCapacity, "%s is passed through whole (instance %s stays); the change set creates %d there", p.name(), in.UUID, total)
			return
		}
	}
	p.checkPassthrough(h, total, pr)
	if !p.mig {
		p.checkTimeSliced(h, pr)
	} else {
		p.checkMIG(pr)
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

// foreignLeft counts the devices on g that no record explains.
func foreignLeft(g manager.GPUView, insts []manager.InstanceView) int {
	gis, vfs, mdevs := map[[2]int]bool{}, map[string]bool{}, map[string]bool{}
	for _, in := range insts {
		if in.GPUUUID != g.UUID {
			continue
		}
		gis[[2]int{in.GIStart, in.GIProfileID}] = true
		vfs[in.VF] = true
		mdevs[in.MdevUUID] = true
	}
	n := 0
	for _, gi := range g.MIG.Instances {
		if !gis[[2]int{gi.Placement.Start, gi.ProfileID}] {
			n++
		}
	}
	for _, vf := range g.VGPU.VFs {
		if vf.Type != 0 && !vfs[vf.PCI] {
			n++
		}
	}
	for _, md := range g.VGPU.Mdevs {
		if !mdevs[md.UUID] {
			n++
		}
	}
	return n
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
// beside those that stay, within each profile's per-GPU maximum.
func (p *gpuPlan) checkMIG(pr *problems) {
	names, n := p.wanted(store.KindMIG)
	if n == 0 {
		return
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
	occupied, count := p.migHeld()
	var needs []string
	sizes := 0
	for _, name := range names {
		k := p.want[name]
		if max := maxOf[ids[name]]; max > 0 && count[ids[name]]+k > max {
			pr.add(manager.ErrNoCapacity, "%s: %s×%d wanted, at most %d fit (the profile's maximum per GPU is %d, %d stay)",
				p.name(), name, k, max-min(max, count[ids[name]]), max, count[ids[name]])
			return
		}
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
		for k < p.want[name] && fit.feasible(occupied, repeatName(name, k+1)) {
			k++
		}
		alone = append(alone, fmt.Sprintf("%s×%d", name, k))
	}
	pr.add(manager.ErrNoCapacity, "%s: %s wanted do not fit beside the GPU instances that stay: %s (each profile on its own, at most %s fit)",
		p.name(), p.list(names), why, strings.Join(alone, ", "))
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

// checkTenants: every create's tenant exists once the tenant changes are
// done, may use the profile, and its quota takes all of its creates beside
// the instances it keeps. Tenants the change set defines or updates count
// with the settings it gives them.
func checkTenants(h *host, cs ChangeSet, destroyed map[string]bool, creates []Change, pr *problems) {
	final := map[string]*tenant.Tenant{}
	for name, v := range h.tenants {
		t := v.Tenant.Tenant
		final[name] = &t
	}
	for _, c := range cs.Changes {
		switch c.Op {
		case OpDefineTenant, OpUpdateTenant:
			if c.Settings == nil {
				// Refused by its own step; no quota is known to check.
				final[c.Tenant] = nil
				continue
			}
			t := c.Settings.tenant(c.Tenant)
			final[c.Tenant] = &t
		}
	}
	for _, c := range cs.Changes {
		if c.Op == OpUndefineTenant {
			delete(final, c.Tenant)
		}
	}
	used := map[string]tenant.Usage{}
	for _, in := range h.insts {
		if destroyed[in.UUID] || in.State == store.StateDestroying {
			continue
		}
		u := used[in.Tenant]
		u.VRAMBytes += in.VRAMBytes
		u.ComputeMilli += in.ComputeMilli
		u.Instances++
		used[in.Tenant] = u
	}
	asked := map[string]tenant.Usage{}
	var names []string
	for _, c := range creates {
		t, ok := final[c.Tenant]
		if !ok {
			pr.add(manager.ErrNotFound, "%s: tenant %s is neither defined on the host nor by the change set", c, c.Tenant)
			continue
		}
		if t == nil {
			continue
		}
		vram, compute, model, profile := c.VRAMBytes, c.ComputeMilli, c.Model, c.Profile
		if g, ok := h.findGPU(gpuID(c)); ok {
			if info, _, ok := h.resolve(g.Model, c.Profile); ok {
				vram, compute, model, profile = info.VRAMBytes, info.ComputeMilli, g.Model, info.Name
			}
		}
		// The manager also accepts a profile under the name it was asked by.
		requested := c.Profile
		if c.Model != "" {
			requested = c.Model + "/" + c.Profile
		}
		if errors.Is(t.Admit(tenant.Usage{}, tenant.Request{Model: model, Profile: profile}), tenant.ErrNotAllowed) &&
			errors.Is(t.Admit(tenant.Usage{}, tenant.Request{Model: model, Profile: requested}), tenant.ErrNotAllowed) {
			pr.add(manager.ErrInvalidArgument, "%s: tenant %s may not use %s on %s (its allowed models or profiles)", c, c.Tenant, profile, model)
			continue
		}
		a, seen := asked[c.Tenant]
		if !seen {
			names = append(names, c.Tenant)
		}
		a.VRAMBytes += vram
		a.ComputeMilli += compute
		a.Instances++
		asked[c.Tenant] = a
	}
	for _, name := range names {
		t, u, a := final[name], used[name], asked[name]
		var over []tenant.Overage
		for _, o := range []tenant.Overage{
			{Resource: tenant.ResourceVRAM, Quota: t.Quota.VRAMBytes, Used: u.VRAMBytes, Request: a.VRAMBytes},
			{Resource: tenant.ResourceCompute, Quota: t.Quota.ComputeMilli, Used: u.ComputeMilli, Request: a.ComputeMilli},
			{Resource: tenant.ResourceInstances, Quota: t.Quota.MaxInstances, Used: u.Instances, Request: a.Instances},
		} {
			if o.Quota != tenant.Unlimited && (o.Used > o.Quota || o.Request > o.Quota-o.Used) {
				over = append(over, o)
			}
		}
		if len(over) > 0 {
			qe := &tenant.QuotaError{Tenant: name, Over: over}
			pr.add(manager.ErrQuotaExceeded, "the %d instances to create for tenant %s go over its quota: %s", a.Instances, name, strings.TrimPrefix(qe.Error(), "tenant "+name+": "))
		}
	}
}
