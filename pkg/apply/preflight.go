package apply

import (
	"fmt"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
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
	// Concurrency is how many GPUs' changes run at once; 0 means
	// DefaultConcurrency.
	Concurrency int
}

// DefaultConcurrency is how many GPUs' changes Execute runs at once when
// Limits.Concurrency is 0.
const DefaultConcurrency = 16

func (l Limits) concurrency() int {
	if l.Concurrency > 0 {
		return l.Concurrency
	}
	return DefaultConcurrency
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
	var pr problems
	checkValues(h, cs, modes, &pr)
	checkGPUSettings(h, cs, destroyed, &pr)
	if len(creates) == 0 {
		return pr.err(cs)
	}
	// In Execute's order, so the GPUs' problems are listed in the order
	// its creates would meet them.
	sortChanges(creates)
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
			p = &gpuPlan{g: g, mig: g.MIG.Enabled, want: map[string]int{}, info: map[string]manager.ProfileInfo{}, ciWant: map[key]int{}}
			if on, ok := modes[g.UUID]; ok {
				p.mig = on
			}
			plans[g.UUID] = p
			gpus = append(gpus, g.UUID)
		}
		info, _, ok := h.resolve(g.Model, c.Profile)
		if !ok {
			continue // refused by checkValues
		}
		if p.want[info.Name] == 0 {
			p.order = append(p.order, info.Name)
		}
		p.want[info.Name]++
		p.info[info.Name] = info
		if info.GPUInstance != "" {
			k := key{info.Name, c.Tenant}
			if p.ciWant[k] == 0 {
				p.ciOrder = append(p.ciOrder, k)
			}
			p.ciWant[k]++
		}
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
	return pr.err(cs)
}
