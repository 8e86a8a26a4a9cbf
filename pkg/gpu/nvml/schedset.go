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
	ctx, release, herr := b.hold(ctx, "VGPUScheduler")
	if herr != nil {
		return gpu.VGPUScheduler{}, herr
	}
	defer release()
	s, err := b.Probe(uuid).SchedulerState(ctx)
	if err != nil {
		return gpu.VGPUScheduler{}, err
	}
	return gpu.VGPUScheduler{Policy: policyName(s.Policy), Timeslice: s.Timeslice}, nil
}

// policyName is NVML's policy number by pkg/gpu's name.
func policyName(p uint32) string {
	switch p {
	case PolicyBestEffort:
		return gpu.SchedBestEffort
	case PolicyEqualShare:
		return gpu.SchedEqualShare
	case PolicyFixedShare:
		return gpu.SchedFixedShare
	}
	return "unknown"
}

// policyNumber is pkg/gpu's policy name as NVML numbers it.
func policyNumber(name string) (uint32, error) {
	switch name {
	case gpu.SchedBestEffort:
		return PolicyBestEffort, nil
	case gpu.SchedEqualShare:
		return PolicyEqualShare, nil
	case gpu.SchedFixedShare:
		return PolicyFixedShare, nil
	}
	return 0, fmt.Errorf("scheduler policy %q: %w", name, gpu.ErrInvalid)
}

// SetVGPUScheduler sets the GPU's scheduler policy and time slice, within
// the GPU's capabilities (InvalidArgument outside them).
func (b *Backend) SetVGPUScheduler(ctx context.Context, uuid string, s gpu.VGPUScheduler) error {
	ctx, release, herr := b.hold(ctx, "SetVGPUScheduler")
	if herr != nil {
		return herr
	}
	defer release()
	p := b.Probe(uuid)
	pol, err := policyNumber(s.Policy)
	if err != nil {
		return fmt.Errorf("GPU %s: %w", uuid, err)
	}
	st := SchedulerState{Policy: pol}
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
