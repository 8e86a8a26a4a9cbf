package apply

import (
	"errors"
	"fmt"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
)

// SchedulerSpec is a layout entry's scheduler: a pinned policy and time
// slice, or the adaptive mode (the share loop chooses), as `vgpuctl gpu
// scheduler` sets them.
type SchedulerSpec struct {
	// Mode is pinned (the default with a policy) or adaptive.
	Mode string `json:"mode,omitempty"`
	// Policy is best_effort, equal_share or fixed_share.
	Policy string `json:"policy,omitempty"`
	// Timeslice is a duration ("2ms"); empty: the driver's default.
	Timeslice string `json:"timeslice,omitempty"`
}

// request is the manager's request for s, checked: every value the
// set-scheduler step sends to the driver, so that Parse, the dry run and
// the pre-flight refuse what the driver would. Its errors say what is
// wrong and carry no sentinel: each caller names the refusal
// (ErrInvalidArgument) once, where it reports it.
func (s SchedulerSpec) request() (manager.SchedulerRequest, error) {
	r := manager.SchedulerRequest{Mode: s.Mode}
	switch s.Mode {
	case "", manager.SchedPinned, manager.SchedAdaptive:
	default:
		return r, fmt.Errorf("mode %q: want pinned or adaptive", s.Mode)
	}
	if s.Mode == manager.SchedAdaptive {
		if s.Policy != "" || s.Timeslice != "" {
			return r, errors.New("the adaptive mode lets the share loop choose: give neither policy nor timeslice")
		}
		return r, nil
	}
	p, err := gpu.ParseSchedPolicy(s.Policy)
	if err != nil {
		return r, err
	}
	r.Mode, r.Policy = manager.SchedPinned, p
	if s.Timeslice != "" {
		d, err := time.ParseDuration(s.Timeslice)
		if err != nil || d <= 0 {
			return r, fmt.Errorf("timeslice %q: want a duration such as 2ms (%v..%v), or leave it out for the driver's default",
				s.Timeslice, gpu.MinTimeslice, gpu.MaxTimeslice)
		}
		if err := gpu.ValidateTimeslice(d); err != nil {
			return r, fmt.Errorf("timeslice %q: %w", s.Timeslice, err)
		}
		r.Timeslice = d
	}
	return r, nil
}

func (s *SchedulerSpec) String() string {
	if s == nil {
		return "-"
	}
	r, err := s.request()
	switch {
	case err != nil:
		return fmt.Sprintf("%+v", *s)
	case r.Mode == manager.SchedAdaptive:
		return "adaptive (the share loop chooses)"
	case r.Timeslice == 0:
		return r.Policy + " (the driver's time slice)"
	}
	return fmt.Sprintf("%s, time slice %v", r.Policy, r.Timeslice)
}

// scheduler adds the set-scheduler change the entry asks of the GPU, given
// its MIG mode after the entry's changes (mig).
func (gd *gpuDiff) scheduler(mig bool) error {
	spec := gd.e.Scheduler
	if spec == nil {
		return nil
	}
	field := gd.e.Source + ".scheduler"
	r, err := spec.request()
	if err != nil {
		return gd.df.fail(manager.ErrInvalidArgument, field, nil, "%v", err)
	}
	g := gd.g
	if mig || g.VGPU.Flavour == "" || g.VGPU.Flavour == gpu.FlavourNone {
		return gd.df.fail(manager.ErrInvalidArgument, field, nil, "GPU %s has no time-sliced vGPU scheduler (MIG on, or no vGPU manager); leave scheduler out for it", g.PCI)
	}
	cur := g.Scheduler
	same := false
	switch {
	case r.Mode == manager.SchedAdaptive:
		same = cur == nil || cur.Mode == manager.SchedAdaptive
	case cur != nil:
		same = cur.Mode == manager.SchedPinned && cur.Policy == r.Policy && cur.Timeslice == gpu.SettableTimeslice(r.Timeslice)
	}
	if same {
		return nil
	}
	gd.df.cs.Changes = append(gd.df.cs.Changes, Change{Op: OpSetScheduler, GPU: g.PCI, GPUUUID: g.UUID, Model: g.Model,
		Scheduler: spec, Source: gd.e.Source})
	return nil
}
