package nvml

import (
	"context"
	"fmt"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// The per-GPU-instance vGPU scheduler of Blackwell GB20x: the vGPUs of one
// GPU instance take turns under a scheduler of that GPU instance
// (nvmlGpuInstance{Get,Set}VgpuSchedulerState_v2,
// nvmlGpuInstanceGetVgpuSchedulerLog_v2; the unversioned ones are
// deprecated). A set is NOT_SUPPORTED (gpu.ErrNotSupported) while a VM
// runs in the GPU instance, and on GPUs without such schedulers; a GPU
// instance that is gone is gpu.ErrNotFound. The driver forgets the setting
// when the GPU instance is destroyed and when the module is unloaded.

// giCall runs one call on GPU instance giID of GPU uuid, after checking
// that the driver's library has sym.
func giCall[T any](ctx context.Context, b *Backend, uuid string, giID int, sym, op string, fn func(h gonvml.GpuInstance) (T, gonvml.Return)) (T, error) {
	var zero T
	if err := b.symbol(sym); err != nil {
		return zero, fmt.Errorf("GPU %s: %w", uuid, err)
	}
	h, err := b.gpuInstance(ctx, uuid, giID)
	if err != nil {
		return zero, err
	}
	v, err := call(ctx, b, op, func() (T, gonvml.Return) { return fn(h) })
	if err != nil {
		return zero, fmt.Errorf("GPU instance %d on GPU %s: %s: %w", giID, uuid, op, err)
	}
	return v, nil
}

// GPUInstanceSchedulerState reads the scheduler of GPU instance giID (its
// graphics engine's), as SchedulerState does the device's.
func (b *Backend) GPUInstanceSchedulerState(ctx context.Context, uuid string, giID int) (SchedulerState, error) {
	ctx, release, herr := b.hold(ctx, "GPUInstanceSchedulerState")
	if herr != nil {
		return SchedulerState{}, herr
	}
	defer release()
	s, err := giCall(ctx, b, uuid, giID, "nvmlGpuInstanceGetVgpuSchedulerState_v2", "GpuInstanceGetVgpuSchedulerState_v2",
		func(h gonvml.GpuInstance) (gonvml.VgpuSchedulerStateInfo_v2, gonvml.Return) {
			return h.GetVgpuSchedulerState_v2(gonvml.VgpuSchedulerStateInfo_v2{EngineId: gonvml.VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS})
		})
	if err != nil {
		return SchedulerState{}, err
	}
	return SchedulerState{Policy: s.SchedulerPolicy, ARR: s.AvgFactor != 0, AvgFactor: s.AvgFactor, Timeslice: time.Duration(s.Timeslice)}, nil
}

// SetGPUInstanceSchedulerState sets the scheduler of GPU instance giID,
// with SetSchedulerState's arguments (a time slice is sent as its
// frequency).
func (b *Backend) SetGPUInstanceSchedulerState(ctx context.Context, uuid string, giID int, s SchedulerState) error {
	ctx, release, herr := b.hold(ctx, "SetGPUInstanceSchedulerState")
	if herr != nil {
		return herr
	}
	defer release()
	set := gonvml.VgpuSchedulerState_v2{EngineId: gonvml.VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS, SchedulerPolicy: s.Policy}
	if s.ARR {
		set.AvgFactor, set.Frequency = s.AvgFactor, s.Frequency
	} else {
		set.Frequency = SliceFrequency(s.Timeslice)
	}
	_, err := giCall(ctx, b, uuid, giID, "nvmlGpuInstanceSetVgpuSchedulerState_v2", "GpuInstanceSetVgpuSchedulerState_v2",
		func(h gonvml.GpuInstance) (struct{}, gonvml.Return) {
			return struct{}{}, h.SetVgpuSchedulerState_v2(&set)
		})
	return err
}

// GPUInstanceSchedulerLog reads the log of recent runs of GPU instance
// giID's scheduler, as SchedulerLog does the device's.
func (b *Backend) GPUInstanceSchedulerLog(ctx context.Context, uuid string, giID int) (SchedulerLog, error) {
	ctx, release, herr := b.hold(ctx, "GPUInstanceSchedulerLog")
	if herr != nil {
		return SchedulerLog{}, herr
	}
	defer release()
	l, err := giCall(ctx, b, uuid, giID, "nvmlGpuInstanceGetVgpuSchedulerLog_v2", "GpuInstanceGetVgpuSchedulerLog_v2",
		func(h gonvml.GpuInstance) (gonvml.VgpuSchedulerLogInfo_v2, gonvml.Return) {
			return h.GetVgpuSchedulerLog_v2(gonvml.VgpuSchedulerLogInfo_v2{EngineId: gonvml.VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS})
		})
	if err != nil {
		return SchedulerLog{}, err
	}
	return schedulerLogOf(l), nil
}

// GPUInstanceScheduler and SetGPUInstanceScheduler are the GPU instance's
// scheduler as the manager sets it: pkg/gpu's policy names, a time slice
// inside the documented range (the GPU instance calls have no
// capabilities query of their own; the device's range applies).
func (b *Backend) GPUInstanceScheduler(ctx context.Context, uuid string, giID int) (gpu.VGPUScheduler, error) {
	ctx, release, herr := b.hold(ctx, "GPUInstanceScheduler")
	if herr != nil {
		return gpu.VGPUScheduler{}, herr
	}
	defer release()
	s, err := b.GPUInstanceSchedulerState(ctx, uuid, giID)
	if err != nil {
		return gpu.VGPUScheduler{}, err
	}
	return gpu.VGPUScheduler{Policy: policyName(s.Policy), Timeslice: s.Timeslice}, nil
}

// SetGPUInstanceScheduler sets GPU instance giID's policy and time slice.
func (b *Backend) SetGPUInstanceScheduler(ctx context.Context, uuid string, giID int, s gpu.VGPUScheduler) error {
	ctx, release, herr := b.hold(ctx, "SetGPUInstanceScheduler")
	if herr != nil {
		return herr
	}
	defer release()
	p, err := policyNumber(s.Policy)
	if err != nil {
		return fmt.Errorf("GPU %s: %w", uuid, err)
	}
	if err := gpu.ValidateTimeslice(s.Timeslice); err != nil {
		return fmt.Errorf("GPU instance %d on GPU %s: %w", giID, uuid, err)
	}
	return b.SetGPUInstanceSchedulerState(ctx, uuid, giID, SchedulerState{Policy: p, Timeslice: gpu.SettableTimeslice(s.Timeslice)})
}
