package apply

import (
	"context"
	"fmt"
	"sort"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// The per-GPU-instance scheduler in layouts: an instance line of a
// MIG-backed vGPU type on a Blackwell GB20x GPU may carry scheduler:, the
// setting of the GPU instances that hold that line's vGPUs (they share
// GPU instances, which time-slice them). It is set after the creates,
// which make the GPU instances, by one set-gpu-instance-scheduler change
// per line; a line whose GPU instances already hold the setting, with no
// create to come, asks for nothing, so applying a layout again changes
// nothing. NVIDIA's formats carry no scheduler settings.

// giSchedulers adds the set-gpu-instance-scheduler changes of the
// entry's instance lines; mig is the GPU's MIG mode after the entry's
// changes, modeChange whether the entry changes it (every instance is
// then created again).
func (gd *gpuDiff) giSchedulers(mig, modeChange bool) error {
	g := gd.g
	// vGPUs of one type share GPU instances whatever their tenant: lines of
	// one type must not ask for two settings, which would undo each other.
	byType := map[string]int{}
	for j, in := range gd.e.Instances {
		if in.Scheduler == nil {
			continue
		}
		field := fmt.Sprintf("%s.instances[%d].scheduler", gd.e.Source, j)
		k := gd.order[j]
		if err := gd.df.h.giSchedulerRefusal(g, mig, gd.info[k.profile].Kind, in.Scheduler); err != "" {
			return gd.df.fail(manager.ErrInvalidArgument, field, nil, "%s", err)
		}
		if prev, ok := byType[k.profile]; ok && *gd.e.Instances[prev].Scheduler != *in.Scheduler {
			return gd.df.fail(manager.ErrInvalidArgument, field, nil, "%s shares GPU instances with instances[%d] (vGPUs of one type share them whatever their tenant); give both lines one scheduler", k.profile, prev)
		}
		byType[k.profile] = j
		if gd.want[k] == 0 || !modeChange && gd.have[k] >= gd.want[k] && gd.giSchedHeld(k, in.Scheduler) {
			continue
		}
		gd.df.cs.Changes = append(gd.df.cs.Changes, Change{Op: OpSetGPUInstanceScheduler, GPU: g.PCI, GPUUUID: g.UUID, Model: g.Model,
			Profile: k.profile, Kind: string(store.KindMIGVGPU), Tenant: k.tenant, Scheduler: in.Scheduler, Source: gd.e.Source})
	}
	return nil
}

// giSchedulerRefusal says why spec cannot be set on the GPU instances of
// a profile of kind on g with MIG mode mig ("" when it can).
func (h *host) giSchedulerRefusal(g manager.GPUView, mig bool, kind string, spec *SchedulerSpec) string {
	if _, err := spec.request(); err != nil {
		return err.Error()
	}
	switch {
	case !h.giSched[g.Model]:
		return fmt.Sprintf("GPU %s (%s) has no per-GPU-instance vGPU scheduler (only Blackwell GB20x GPUs such as RTX PRO 6000 Blackwell have one); set the GPU's scheduler on the layout entry instead", g.PCI, g.Model)
	case !mig:
		return fmt.Sprintf("GPU %s has MIG off: it has no GPU instances", g.PCI)
	case kind != string(store.KindMIGVGPU):
		return fmt.Sprintf("only MIG-backed vGPU types live in a GPU instance with a vGPU scheduler, not a %s profile", kind)
	}
	return ""
}

// giSchedHeld reports whether every GPU instance holding instances of k
// on the GPU has spec's setting already.
func (gd *gpuDiff) giSchedHeld(k key, spec *SchedulerSpec) bool {
	r, err := spec.request()
	if err != nil {
		return false
	}
	for _, gi := range giIDsOf(gd.df.h, gd.g.UUID, k.profile, k.tenant, gd.destroyed) {
		held := false
		for _, v := range gd.g.GPUInstanceSchedulers {
			if v.GPUInstance != gi {
				continue
			}
			if r.Mode == manager.SchedAdaptive {
				held = v.Mode == manager.SchedAdaptive
			} else {
				held = v.Mode == manager.SchedPinned && v.Policy == r.Policy && v.Timeslice == gpu.SettableTimeslice(r.Timeslice)
			}
		}
		if !held {
			return false
		}
	}
	return true
}

// giIDsOf lists the GPU instances that hold the instances of profile and
// tenant on GPU gpuUUID, except those in skip. Only ready instances count:
// a failed or lost one keeps the id of a GPU instance that may be gone, or
// that the driver gave to another placement since.
func giIDsOf(h *host, gpuUUID, profile, tenant string, skip map[string]bool) []int {
	seen := map[int]bool{}
	var out []int
	for _, in := range h.insts {
		if in.GPUUUID != gpuUUID || in.Tenant != tenant || in.Kind != store.KindMIGVGPU || in.GIID < 0 || skip[in.UUID] || in.State != store.StateReady {
			continue
		}
		if h.profileOf(in.Instance) != profile || seen[in.GIID] {
			continue
		}
		seen[in.GIID] = true
		out = append(out, in.GIID)
	}
	sort.Ints(out)
	return out
}

// setGPUInstanceSchedulers performs a set-gpu-instance-scheduler change:
// the setting on each GPU instance that holds the line's instances now. A
// setting the driver holds back while a VM runs is pending, which the
// manager keeps and sets later: the change is done.
func setGPUInstanceSchedulers(ctx context.Context, m Manager, c Change) error {
	if c.Scheduler == nil {
		return fmt.Errorf("%w: set-gpu-instance-scheduler change without a setting", manager.ErrInvalidArgument)
	}
	r, err := c.Scheduler.request()
	if err != nil {
		return fmt.Errorf("%w: %v", manager.ErrInvalidArgument, err)
	}
	h, err := readHost(m)
	if err != nil {
		return err
	}
	g, ok := h.findGPU(gpuID(c))
	if !ok {
		return fmt.Errorf("%w: no GPU %s on this host", manager.ErrNotFound, gpuID(c))
	}
	for _, gi := range giIDsOf(h, g.UUID, c.Profile, c.Tenant, nil) {
		if _, err := m.SetGPUInstanceScheduler(ctx, g.UUID, gi, r); err != nil {
			return err
		}
	}
	return nil
}

// checkGPUInstanceScheduler is the pre-flight of a
// set-gpu-instance-scheduler change (checkValues).
func checkGPUInstanceScheduler(h *host, c Change, modes map[string]bool, pr *problems) {
	if c.Scheduler == nil {
		pr.add(manager.ErrInvalidArgument, "%s: the change sets no scheduler", c)
		return
	}
	g, ok := h.findGPU(gpuID(c))
	if !ok {
		pr.add(manager.ErrNotFound, "%s: no GPU %s on this host", c, gpuID(c))
		return
	}
	mig := g.MIG.Enabled
	if on, set := modes[g.UUID]; set {
		mig = on
	}
	p, why, ok := h.resolve(g.Model, c.Profile)
	if !ok {
		pr.add(manager.ErrInvalidArgument, "%s: GPU %s: %s", c, g.PCI, why)
		return
	}
	if why := h.giSchedulerRefusal(g, mig, p.Kind, c.Scheduler); why != "" {
		pr.add(manager.ErrInvalidArgument, "%s: %s", c, why)
	}
}
