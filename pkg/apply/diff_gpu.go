package apply

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

type key struct{ profile, tenant string }

// gpuDiff carries the diff of one covered GPU.
type gpuDiff struct {
	df *differ
	g  manager.GPUView
	e  *LayoutEntry
	// destroyed collects the instances the whole Diff destroys, every GPU's.
	destroyed map[string]bool
	// want counts what the entry asks for by (canonical profile, tenant),
	// order lists its keys as the entry does, info has the profiles by name.
	want  map[key]int
	order []key
	info  map[string]manager.ProfileInfo
	// have counts the instances kept, by the same keys.
	have map[key]int
}

// gpu diffs one covered GPU: what the entry asks of it and the MIG mode
// that needs; then either a mode change, which takes every instance off
// the GPU, or the choice of what to keep and what to destroy; then the
// creates for what is still missing.
func (df *differ) gpu(g manager.GPUView, e *LayoutEntry, destroyed map[string]bool) error {
	if g.Lost || g.State == gpu.StateLost {
		df.warn("%s: GPU %s is lost; it is left as it is until it returns", e.Source, g.PCI)
		return nil
	}
	gd := &gpuDiff{df: df, g: g, e: e, destroyed: destroyed,
		want: map[key]int{}, info: map[string]manager.ProfileInfo{}, have: map[key]int{}}
	needOn, needOff, err := gd.wanted()
	if err != nil {
		return err
	}
	mode, err := gd.mode(needOn, needOff)
	if err != nil {
		return err
	}
	here := gd.here()
	migAfter := g.MIG.Enabled
	if mode != nil && g.MIG.Capable && *mode != g.MIG.Enabled {
		gd.changeMode(mode, here)
		migAfter = *mode
	} else {
		gd.reconcile(here)
	}
	if err := gd.scheduler(migAfter); err != nil {
		return err
	}
	gd.creates()
	if err := gd.giSchedulers(migAfter, mode != nil && g.MIG.Capable && *mode != g.MIG.Enabled); err != nil {
		return err
	}
	df.foreign(g, e)
	return nil
}

// inScope says whether the entry describes instances of kind k; an entry
// without a scope describes every kind.
func (gd *gpuDiff) inScope(k store.InstanceKind) bool {
	return len(gd.e.Scope) == 0 || slices.Contains(gd.e.Scope, k)
}

// wanted resolves the entry's instances on the GPU's model into want,
// order and info. It returns a profile asked for that needs MIG on (MIG
// instances, MIG-backed vGPUs) and one that needs it off (time-sliced
// vGPUs); a GPU cannot have both.
func (gd *gpuDiff) wanted() (needOn, needOff string, err error) {
	df, g, e := gd.df, gd.g, gd.e
	for j, in := range e.Instances {
		field := fmt.Sprintf("%s.instances[%d]", e.Source, j)
		p, why, ok := df.h.resolve(g.Model, in.Profile)
		if !ok {
			return "", "", df.fail(manager.ErrInvalidArgument, field+".profile", nil, "GPU %s: %s", g.PCI, why)
		}
		if !gd.inScope(store.InstanceKind(p.Kind)) {
			return "", "", df.fail(manager.ErrInvalidArgument, field+".profile", nil, "%s is a %s profile, outside this entry's scope (%s)", p.Name, p.Kind, scopeList(e.Scope))
		}
		k := key{p.Name, in.Tenant}
		if _, dup := gd.want[k]; dup {
			return "", "", df.fail(manager.ErrInvalidArgument, field, nil, "asks again for %s of tenant %s on GPU %s (another spelling of the same profile); give one count", p.Name, in.Tenant, g.PCI)
		}
		gd.want[k] = in.N()
		gd.info[p.Name] = p
		gd.order = append(gd.order, k)
		if in.N() == 0 {
			continue
		}
		switch store.InstanceKind(p.Kind) {
		case store.KindMIG, store.KindMIGVGPU:
			needOn = p.Name
		case store.KindVGPU:
			needOff = p.Name
		}
	}
	if needOn != "" && needOff != "" {
		return "", "", df.fail(manager.ErrInvalidArgument, e.Source+".instances", nil, "GPU %s: %s needs MIG on and %s needs it off; they cannot share a GPU", g.PCI, needOn, needOff)
	}
	return needOn, needOff, nil
}

// mode is the MIG mode the GPU must have: the entry's, which must agree
// with what its profiles need; else the one they need; else nil, when
// the entry does not care.
func (gd *gpuDiff) mode(needOn, needOff string) (*bool, error) {
	df, g, e := gd.df, gd.g, gd.e
	mode := e.MIG
	if mode != nil {
		switch {
		case *mode && needOff != "":
			return nil, df.fail(manager.ErrInvalidArgument, e.Source+".mig", nil, "MIG on, but the time-sliced vGPU type %s needs it off", needOff)
		case !*mode && needOn != "":
			return nil, df.fail(manager.ErrInvalidArgument, e.Source+".mig", nil, "MIG off, but %s needs it on", needOn)
		}
	} else if needOn != "" || needOff != "" {
		on := needOn != ""
		mode = &on
	}
	if mode != nil && *mode && !g.MIG.Capable {
		return nil, df.fail(manager.ErrInvalidArgument, e.Source, nil, "GPU %s (%s) has no MIG", g.PCI, g.Model)
	}
	return mode, nil
}

// here lists the GPU's instances, except those being destroyed already.
func (gd *gpuDiff) here() []manager.InstanceView {
	var here []manager.InstanceView
	for _, in := range gd.df.h.insts {
		if in.GPUUUID == gd.g.UUID && in.State != store.StateDestroying {
			here = append(here, in)
		}
	}
	return here
}

func (gd *gpuDiff) destroy(in manager.InstanceView, reason string) {
	gd.destroyed[in.UUID] = true
	gd.df.cs.Changes = append(gd.df.cs.Changes, Change{Op: OpDestroy, GPU: gd.g.PCI, GPUUUID: gd.g.UUID, Model: gd.g.Model, Instance: in.UUID,
		Profile: gd.df.h.profileOf(in.Instance), Kind: string(in.Kind), Tenant: in.Tenant, Reason: reason, Source: gd.e.Source})
}

// changeMode destroys every instance on the GPU, in the entry's scope or
// not, and sets the mode: the manager changes a MIG mode only on a GPU
// without instances. Nothing is kept.
func (gd *gpuDiff) changeMode(mode *bool, here []manager.InstanceView) {
	for _, in := range here {
		gd.destroy(in, fmt.Sprintf("MIG mode changes to %s", onOff(*mode)))
	}
	g := gd.g
	gd.df.cs.Changes = append(gd.df.cs.Changes, Change{Op: OpSetMIGMode, GPU: g.PCI, GPUUUID: g.UUID, Model: g.Model, MIG: mode, Source: gd.e.Source})
}

// reconcile keeps, on a GPU whose MIG mode stays, the instances in the
// entry's scope that it still asks for and destroys the others. With MIG
// on, which ones are kept is revised so that the creates find slots.
func (gd *gpuDiff) reconcile(here []manager.InstanceView) {
	groups := gd.group(here)
	keys := sortedGroupKeys(groups)
	sel := gd.selectKeeps(groups, keys)
	if gd.g.MIG.Enabled {
		gd.fitMIG(groups, keys, sel)
	}
	gd.settle(groups, keys, sel)
}

// group puts the instances in the entry's scope into groups by (profile,
// tenant). Failed instances are destroyed instead: they are never kept.
func (gd *gpuDiff) group(here []manager.InstanceView) map[key][]manager.InstanceView {
	groups := map[key][]manager.InstanceView{}
	for _, in := range here {
		if !gd.inScope(in.Kind) {
			continue
		}
		if in.State == store.StateFailed {
			gd.destroy(in, "failed: "+in.Reason)
			continue
		}
		k := key{gd.df.h.profileOf(in.Instance), in.Tenant}
		groups[k] = append(groups[k], in)
	}
	return groups
}

// selectKeeps orders each group and marks the first instances of it, up to
// the count the entry asks for, as kept.
func (gd *gpuDiff) selectKeeps(groups map[key][]manager.InstanceView, keys []key) map[key][]bool {
	sel := map[key][]bool{}
	for _, k := range keys {
		ins := groups[k]
		// Keep attached instances first, then the oldest.
		sort.SliceStable(ins, func(i, j int) bool {
			ai, aj := ins[i].Attachment != nil, ins[j].Attachment != nil
			if ai != aj {
				return ai
			}
			if !ins[i].Created.Equal(ins[j].Created) {
				return ins[i].Created.Before(ins[j].Created)
			}
			return ins[i].UUID < ins[j].UUID
		})
		sel[k] = make([]bool, len(ins))
		for i := 0; i < min(gd.want[k], len(ins)); i++ {
			sel[k][i] = true
		}
	}
	return sel
}

// settle records the instances sel keeps, counts them in have, and
// destroys the others, saying why.
func (gd *gpuDiff) settle(groups map[key][]manager.InstanceView, keys []key, sel map[key][]bool) {
	for _, k := range keys {
		n := gd.want[k]
		for _, keep := range sel[k] {
			if keep {
				gd.have[k]++
			}
		}
		for i, in := range groups[k] {
			switch {
			case sel[k][i]:
				gd.df.cs.Kept = append(gd.df.cs.Kept, in.UUID)
			case n == 0:
				gd.destroy(in, "not in the layout")
			case gd.have[k] < min(n, len(groups[k])):
				gd.destroy(in, "re-created: where it is, it blocks the slices the layout's new instances need")
			default:
				gd.destroy(in, fmt.Sprintf("the layout asks for %d", n))
			}
		}
	}
}

// creates adds, pinned to the GPU, what the entry asks for beyond what is
// kept, in the entry's order.
func (gd *gpuDiff) creates() {
	g := gd.g
	for _, k := range gd.order {
		p := gd.info[k.profile]
		for i := gd.have[k]; i < gd.want[k]; i++ {
			gd.df.cs.Changes = append(gd.df.cs.Changes, Change{Op: OpCreate, GPU: g.PCI, GPUUUID: g.UUID, Model: g.Model,
				Profile: p.Name, Kind: p.Kind, Tenant: k.tenant, VRAMBytes: p.VRAMBytes, ComputeMilli: p.ComputeMilli, Source: gd.e.Source})
		}
	}
}

// fitMIG revises which MIG instances to keep so that the ones to create
// find slots (migfit.go). It changes sel only when it finds a way.
func (gd *gpuDiff) fitMIG(groups map[key][]manager.InstanceView, keys []key, sel map[key][]bool) {
	var creates []string
	for _, k := range gd.order {
		if _, exists := groups[k]; !exists {
			for i := 0; i < gd.want[k]; i++ {
				creates = append(creates, k.profile)
			}
		}
	}
	var migKeys []key
	var gs [][]manager.InstanceView
	var ws []int
	var ps []string
	short := len(creates) > 0
	for _, k := range keys {
		if slots(groups[k][0]) == 0 {
			continue
		}
		migKeys = append(migKeys, k)
		gs = append(gs, groups[k])
		ws = append(ws, gd.want[k])
		p := k.profile
		if pi, ok := gd.info[k.profile]; ok && pi.Kind != string(store.KindMIG) {
			p = "" // a MIG-backed vGPU type: its GPU instance's profile is not known here
		}
		ps = append(ps, p)
		short = short || gd.want[k] > len(groups[k])
	}
	if !short {
		return
	}
	for _, p := range creates {
		if gd.info[p].Kind != string(store.KindMIG) {
			return
		}
	}
	choice, ok := newMIGFit(gd.g).chooseKeeps(gd.migFixed(groups), gs, ws, creates, ps)
	if !ok {
		return
	}
	for i, k := range migKeys {
		sel[k] = choice[i]
	}
}

// migFixed is what stays occupied on the GPU whatever is kept: GPU
// instances no record explains, and those of instances outside the groups
// that stay.
func (gd *gpuDiff) migFixed(groups map[key][]manager.InstanceView) slotMask {
	inGroup := map[string]bool{}
	for _, ins := range groups {
		for _, in := range ins {
			inGroup[in.UUID] = true
		}
	}
	var fixed slotMask
	owned := map[[2]int]bool{}
	for _, in := range gd.df.h.insts {
		if in.GPUUUID != gd.g.UUID {
			continue
		}
		owned[[2]int{in.GIStart, in.GIProfileID}] = true
		if !inGroup[in.UUID] && !gd.destroyed[in.UUID] {
			fixed |= slots(in)
		}
	}
	for _, gi := range gd.g.MIG.Instances {
		if !owned[[2]int{gi.Placement.Start, gi.ProfileID}] {
			fixed |= rangeMask(gi.Placement.Start, gi.Placement.Size)
		}
	}
	return fixed
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func scopeList(s []store.InstanceKind) string {
	parts := make([]string, len(s))
	for i, k := range s {
		parts[i] = string(k)
	}
	return strings.Join(parts, ", ")
}

func sortedGroupKeys(m map[key][]manager.InstanceView) []key {
	out := make([]key, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].profile != out[j].profile {
			return out[i].profile < out[j].profile
		}
		return out[i].tenant < out[j].tenant
	})
	return out
}

// foreign warns about devices on a covered GPU that no vgpud record
// explains: apply never touches them, and they hold room the layout may need.
func (df *differ) foreign(g manager.GPUView, e *LayoutEntry) {
	if n := foreignLeft(g, df.h.insts); n > 0 {
		df.warn("%s: GPU %s holds %d devices vgpud did not create; apply leaves them, and they keep their room", e.Source, g.PCI, n)
	}
}
