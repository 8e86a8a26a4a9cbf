package sim

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// The per-GPU-instance vGPU scheduler of Blackwell GB20x (nvml.h of
// go-nvml v0.13.4-1: nvmlGpuInstanceGetVgpuSchedulerState_v2,
// nvmlGpuInstanceSetVgpuSchedulerState_v2,
// nvmlGpuInstanceGetVgpuSchedulerLog_v2; the unversioned calls are
// DEPRECATED(13.0) and stay NOT_SUPPORTED here). The vGPUs of one GPU
// instance take turns under it. Refusals, as nvml.h documents them:
//
//	stale or destroyed GPU instance, nil argument   INVALID_ARGUMENT
//	not a vGPU host, not GB20x, a GPU instance      NOT_SUPPORTED
//	  whose profile hosts no vGPU type
//	set while a VM runs in the GPU instance         NOT_SUPPORTED
//	  ("allowed to set only when no VM is running within the GPU instance")
//	engine other than graphics                      as the device-level calls
//	policy, average factor or frequency out of      INVALID_ARGUMENT
//	  range
//
// The setting is lost with the GPU instance (its destroy, a VF rebind, a
// reboot) and when the driver is unloaded ("won't persist across module
// load/unload and GPU Instance creation/deletion").

// giSchedSupported: the GPU has per-GPU-instance schedulers and x hosts
// vGPUs.
func giSchedSupported(g *gpuState, x *gi) nvml.Return {
	if g.model.VGPU == nil || g.Flavour == string(gpu.FlavourNone) || !g.model.GPUInstanceScheduler() {
		return nvml.ERROR_NOT_SUPPORTED
	}
	for _, t := range g.model.VGPU.Types {
		if t.GPUInstanceProfile != nil && *t.GPUInstanceProfile == x.ProfileID {
			return nvml.SUCCESS
		}
	}
	return nvml.ERROR_NOT_SUPPORTED
}

// state is the GPU instance's scheduler in force (the default until set).
func (x *gi) state() sched {
	if x.Sched == nil {
		return sched{Policy: nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT}
	}
	return *x.Sched
}

func giStateInfo(x *gi) (policy, avgFactor, timeslice uint32) {
	s := x.state()
	ts := s.TimesliceNs
	if ts == 0 {
		ts = defaultTimesliceNs
	}
	if s.ARR == nvml.VGPU_SCHEDULER_ARR_ENABLE {
		avgFactor = s.AvgFactor
	}
	return s.Policy, avgFactor, ts
}

// GetVgpuSchedulerState_v2 reports the GPU instance's policy, ARR's
// average factor and time slice.
func (x *gpuInstance) GetVgpuSchedulerState_v2(info nvml.VgpuSchedulerStateInfo_v2) (nvml.VgpuSchedulerStateInfo_v2, nvml.Return) {
	ret := x.read("GpuInstanceGetVgpuSchedulerState_v2", func(g *gpuState, gi *gi) nvml.Return {
		if r := giSchedSupported(g, gi); r != nvml.SUCCESS {
			return r
		}
		if r := engineSupported(info.EngineId); r != nvml.SUCCESS {
			return r
		}
		info.SchedulerPolicy, info.AvgFactor, info.Timeslice = giStateInfo(gi)
		return nvml.SUCCESS
	})
	return info, ret
}

// SetVgpuSchedulerState_v2 sets the GPU instance's scheduler while no VM
// runs in it, with the device-level call's arguments and ranges
// (schedFromV2).
func (x *gpuInstance) SetVgpuSchedulerState_v2(s *nvml.VgpuSchedulerState_v2) nvml.Return {
	return x.write("GpuInstanceSetVgpuSchedulerState_v2", func(g *gpuState, gi *gi) (bool, nvml.Return) {
		if s == nil {
			return false, nvml.ERROR_INVALID_ARGUMENT
		}
		if r := giSchedSupported(g, gi); r != nvml.SUCCESS {
			return false, r
		}
		if r := engineSupported(s.EngineId); r != nvml.SUCCESS {
			return false, r
		}
		for _, v := range g.vgpusOnGI(gi.ID) {
			if v.VM != "" {
				return false, nvml.ERROR_NOT_SUPPORTED
			}
		}
		next, r := schedFromV2(s)
		if r != nvml.SUCCESS {
			return false, r
		}
		if gi.Sched != nil && *gi.Sched == next {
			return false, nvml.SUCCESS
		}
		gi.Sched = &next
		return true, nvml.SUCCESS
	})
}

// GetVgpuSchedulerLog_v2 reports the GPU instance's scheduler state. The
// workload model schedules a MIG-backed vGPU on its GPU instance's share
// without a run log of its own, so the log has no entries.
func (x *gpuInstance) GetVgpuSchedulerLog_v2(info nvml.VgpuSchedulerLogInfo_v2) (nvml.VgpuSchedulerLogInfo_v2, nvml.Return) {
	ret := x.read("GpuInstanceGetVgpuSchedulerLog_v2", func(g *gpuState, gi *gi) nvml.Return {
		if r := giSchedSupported(g, gi); r != nvml.SUCCESS {
			return r
		}
		if r := engineSupported(info.EngineId); r != nvml.SUCCESS {
			return r
		}
		info.SchedulerPolicy, info.AvgFactor, info.Timeslice = giStateInfo(gi)
		info.EntriesCount = 0
		return nvml.SUCCESS
	})
	return info, ret
}

// policyName is a scheduler policy as pkg/gpu names it (Summary).
func policyName(p uint32) string {
	switch p {
	case nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT:
		return gpu.SchedBestEffort
	case nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE:
		return gpu.SchedEqualShare
	case nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE:
		return gpu.SchedFixedShare
	}
	return "unknown"
}
