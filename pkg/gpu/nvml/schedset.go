package nvml

import (
	"context"
	"fmt"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// VGPUScheduler and SetVGPUScheduler are the scheduler as the manager sets
// it for an operator: by GPU UUID and with pkg/gpu's policy names. A
// change is NOT_SUPPORTED (gpu.ErrNotSupported) while a VM with a vGPU
// runs on the GPU, and with MIG on.

// VGPUScheduler reads the GPU's scheduler policy and time slice.
func (b *Backend) VGPUScheduler(ctx context.Context, uuid string) (gpu.VGPUScheduler, error) {
	s, err := b.Probe(uuid).SchedulerState(ctx)
	if err != nil {
		return gpu.VGPUScheduler{}, err
	}
	out := gpu.VGPUScheduler{Timeslice: s.Timeslice}
	switch s.Policy {
	case PolicyBestEffort:
		out.Policy = gpu.SchedBestEffort
	case PolicyEqualShare:
		out.Policy = gpu.SchedEqualShare
	case PolicyFixedShare:
		out.Policy = gpu.SchedFixedShare
	default:
		out.Policy = "unknown"
	}
	return out, nil
}

// SetVGPUScheduler sets the GPU's scheduler policy and time slice, within
// the GPU's capabilities (InvalidArgument outside them).
func (b *Backend) SetVGPUScheduler(ctx context.Context, uuid string, s gpu.VGPUScheduler) error {
	p := b.Probe(uuid)
	var st SchedulerState
	switch s.Policy {
	case gpu.SchedBestEffort:
		st.Policy = PolicyBestEffort
	case gpu.SchedEqualShare:
		st.Policy = PolicyEqualShare
	case gpu.SchedFixedShare:
		st.Policy = PolicyFixedShare
	default:
		return fmt.Errorf("GPU %s: scheduler policy %q: %w", uuid, s.Policy, gpu.ErrInvalid)
	}
	c, err := p.SchedulerCapabilities(ctx)
	if err != nil {
		return err
	}
	if !c.Supports(st.Policy) {
		return fmt.Errorf("GPU %s does not offer scheduler policy %s: %w", uuid, s.Policy, gpu.ErrNotSupported)
	}
	if s.Timeslice != 0 && ((c.MinTimeslice > 0 && s.Timeslice < c.MinTimeslice) || (c.MaxTimeslice > 0 && s.Timeslice > c.MaxTimeslice)) {
		return fmt.Errorf("GPU %s: time slice %v outside the GPU's %v..%v: %w", uuid, s.Timeslice, c.MinTimeslice, c.MaxTimeslice, gpu.ErrInvalid)
	}
	// The _v2 call takes a slice as a frequency in whole Hz: ask for the
	// settable slice nearest to s's inside the GPU's range (the caller
	// reads back what the driver holds).
	st.Timeslice = SliceWithin(s.Timeslice, c.MinTimeslice, c.MaxTimeslice)
	return p.SetSchedulerState(ctx, st)
}
