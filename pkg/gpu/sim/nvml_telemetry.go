package sim

import (
	"encoding/binary"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu/sim/workload"
)

// NVML device calls served by the workload model (pkg/gpu/sim/workload):
// the vGPU scheduler log, utilization, power, clocks, clock event reasons
// and temperature. The model says what the GPU did; these calls add the
// driver's rules (what is NOT_SUPPORTED when) and its encodings.

// telemetry runs a read-only call on the GPU's model, advanced to now.
func (d *device) telemetry(op string, fn func(g *gpuState, r *workload.GPURun) nvml.Return) nvml.Return {
	return d.read(op, func(st *state, g *gpuState) nvml.Return {
		return fn(g, d.h.run(st, g))
	})
}

// GetVgpuSchedulerLog_v2 returns the device-level scheduler log: the last
// 200 runs, oldest first. NOT_SUPPORTED with MIG on (reference 5.3). The
// model keeps no runlist weights: Weight is 0.
func (d *device) GetVgpuSchedulerLog_v2(info nvml.VgpuSchedulerLogInfo_v2) (nvml.VgpuSchedulerLogInfo_v2, nvml.Return) {
	ret := d.telemetry("GetVgpuSchedulerLog_v2", func(g *gpuState, r *workload.GPURun) nvml.Return {
		if rr := schedSupported(g); rr != nvml.SUCCESS {
			return rr
		}
		if rr := engineSupported(info.EngineId); rr != nvml.SUCCESS {
			return rr
		}
		info.SchedulerPolicy, info.Timeslice, info.AvgFactor = g.Sched.Policy, g.timeslice(), 0
		if g.Sched.ARR == nvml.VGPU_SCHEDULER_ARR_ENABLE {
			info.AvgFactor = g.Sched.AvgFactor
		}
		var entries [len(info.LogEntries)]nvml.VgpuSchedulerLogEntry
		n := r.SchedulerLog(entries[:])
		info.EntriesCount = uint32(n)
		for i, e := range entries[:n] {
			info.LogEntries[i] = nvml.VgpuSchedulerLogEntry_v2{Timestamp: e.Timestamp, TimeRunTotal: e.TimeRunTotal, TimeRun: e.TimeRun,
				SwRunlistId: e.SwRunlistId, TargetTimeSlice: e.TargetTimeSlice, CumulativePreemptionTime: e.CumulativePreemptionTime}
		}
		return nvml.SUCCESS
	})
	return info, ret
}

// GetVgpuUtilization returns the utilization samples of the running vGPUs
// newer than lastSeen (µs): SM and memory percent per 100 ms sample, as
// unsigned ints. NOT_FOUND when none is newer; NOT_SUPPORTED with MIG on,
// where vGPU activity is not attributed (reference 5.4).
func (d *device) GetVgpuUtilization(lastSeen uint64) (nvml.ValueType, []nvml.VgpuInstanceUtilizationSample, nvml.Return) {
	var out []nvml.VgpuInstanceUtilizationSample
	ret := d.telemetry("GetVgpuUtilization", func(g *gpuState, r *workload.GPURun) nvml.Return {
		if rr := schedSupported(g); rr != nvml.SUCCESS {
			return rr
		}
		for _, s := range r.Samples(lastSeen) {
			out = append(out, utilSampleOf(s))
		}
		if len(out) == 0 {
			return nvml.ERROR_NOT_FOUND
		}
		return nvml.SUCCESS
	})
	return nvml.VALUE_TYPE_UNSIGNED_INT, out, ret
}

func utilSampleOf(s workload.Sample) nvml.VgpuInstanceUtilizationSample {
	v := nvml.VgpuInstanceUtilizationSample{VgpuInstance: s.Handle, TimeStamp: s.TimeUs}
	binary.LittleEndian.PutUint32(v.SmUtil[:4], s.SM)
	binary.LittleEndian.PutUint32(v.MemUtil[:4], s.Mem)
	return v
}

// GetUtilizationRates is the whole GPU's busy percent over the last
// second; NOT_SUPPORTED with MIG on (reference 5.4).
func (d *device) GetUtilizationRates() (nvml.Utilization, nvml.Return) {
	var u nvml.Utilization
	ret := d.telemetry("GetUtilizationRates", func(g *gpuState, r *workload.GPURun) nvml.Return {
		if g.MIGCurrent {
			return nvml.ERROR_NOT_SUPPORTED
		}
		busy, mem, _, _ := r.LastSecond()
		u.Gpu, u.Memory = uint32(math.Round(100*busy)), uint32(math.Round(100*mem))
		return nvml.SUCCESS
	})
	return u, ret
}

// GetPowerUsage is the power draw in milliwatts averaged over the last second.
func (d *device) GetPowerUsage() (uint32, nvml.Return) {
	var mw uint32
	ret := d.telemetry("GetPowerUsage", func(_ *gpuState, r *workload.GPURun) nvml.Return {
		_, _, w, _ := r.LastSecond()
		mw = uint32(math.Round(w * 1000))
		return nvml.SUCCESS
	})
	return mw, ret
}

// GetTotalEnergyConsumption is the energy drawn since the model started, in mJ.
func (d *device) GetTotalEnergyConsumption() (uint64, nvml.Return) {
	var mj uint64
	ret := d.telemetry("GetTotalEnergyConsumption", func(_ *gpuState, r *workload.GPURun) nvml.Return {
		mj = uint64(r.EnergyMJ())
		return nvml.SUCCESS
	})
	return mj, ret
}

// GetEnforcedPowerLimit is the limit in force (the cap, else the TDP), in mW.
func (d *device) GetEnforcedPowerLimit() (uint32, nvml.Return) {
	var mw uint32
	ret := d.read("GetEnforcedPowerLimit", func(_ *state, g *gpuState) nvml.Return {
		mw = uint32(g.capW() * 1000)
		return nvml.SUCCESS
	})
	return mw, ret
}

// GetPowerManagementLimit is the configured limit, in mW.
func (d *device) GetPowerManagementLimit() (uint32, nvml.Return) {
	return d.GetEnforcedPowerLimit()
}

// GetPowerManagementDefaultLimit is the board's TDP, in mW.
func (d *device) GetPowerManagementDefaultLimit() (uint32, nvml.Return) {
	var mw uint32
	ret := d.read("GetPowerManagementDefaultLimit", func(_ *state, g *gpuState) nvml.Return {
		mw = uint32(workload.PowerOf(g.model.Name).TDPW * 1000)
		return nvml.SUCCESS
	})
	return mw, ret
}

// GetPowerManagementLimitConstraints returns the settable range, in mW.
func (d *device) GetPowerManagementLimitConstraints() (uint32, uint32, nvml.Return) {
	var lo, hi uint32
	ret := d.read("GetPowerManagementLimitConstraints", func(_ *state, g *gpuState) nvml.Return {
		p := workload.PowerOf(g.model.Name)
		lo, hi = uint32(p.MinCapW()*1000), uint32(p.TDPW*1000)
		return nvml.SUCCESS
	})
	return lo, hi, ret
}

// SetPowerManagementLimit caps the GPU's power (mW), INVALID_ARGUMENT
// outside the constraints.
func (d *device) SetPowerManagementLimit(mw uint32) nvml.Return {
	return d.write("SetPowerManagementLimit", func(st *state, g *gpuState) (bool, nvml.Return) {
		p := workload.PowerOf(g.model.Name)
		w := int(mw / 1000)
		if w < p.MinCapW() || w > p.TDPW {
			return false, nvml.ERROR_INVALID_ARGUMENT
		}
		if w == p.TDPW {
			w = 0
		}
		if w == g.PowerCapW {
			return false, nvml.SUCCESS
		}
		d.h.run(st, g)
		g.PowerCapW = w
		return true, nvml.SUCCESS
	})
}

// supportedReasons are the clock event reasons the simulated GPUs report.
const supportedReasons = nvml.ClocksEventReasonGpuIdle | nvml.ClocksEventReasonApplicationsClocksSetting |
	nvml.ClocksEventReasonSwPowerCap | nvml.ClocksThrottleReasonHwSlowdown | nvml.ClocksEventReasonSwThermalSlowdown |
	nvml.ClocksThrottleReasonHwThermalSlowdown | nvml.ClocksThrottleReasonHwPowerBrakeSlowdown

// GetCurrentClocksEventReasons is the bitmask of why the clocks are where
// they are now (reference 5.5).
func (d *device) GetCurrentClocksEventReasons() (uint64, nvml.Return) {
	var m uint64
	ret := d.telemetry("GetCurrentClocksEventReasons", func(_ *gpuState, r *workload.GPURun) nvml.Return {
		m = r.Reasons()
		return nvml.SUCCESS
	})
	return m, ret
}

// GetSupportedClocksEventReasons lists the reasons the GPU can report.
func (d *device) GetSupportedClocksEventReasons() (uint64, nvml.Return) {
	ret := d.read("GetSupportedClocksEventReasons", func(*state, *gpuState) nvml.Return { return nvml.SUCCESS })
	return supportedReasons, ret
}

// GetClockInfo is the current clock in MHz.
func (d *device) GetClockInfo(t nvml.ClockType) (uint32, nvml.Return) {
	var mhz uint32
	ret := d.telemetry("GetClockInfo", func(g *gpuState, r *workload.GPURun) nvml.Return {
		m, rr := clockMHz(g, t, r.ClockFactor())
		mhz = m
		return rr
	})
	return mhz, ret
}

// GetMaxClockInfo is the maximum clock in MHz.
func (d *device) GetMaxClockInfo(t nvml.ClockType) (uint32, nvml.Return) {
	var mhz uint32
	ret := d.read("GetMaxClockInfo", func(_ *state, g *gpuState) nvml.Return {
		m, rr := clockMHz(g, t, 1)
		mhz = m
		return rr
	})
	return mhz, ret
}

// clockMHz is g's clock t in MHz with the SM clock at the fraction cf of
// its maximum (the memory clock does not move).
func clockMHz(g *gpuState, t nvml.ClockType, cf float64) (uint32, nvml.Return) {
	p := workload.PowerOf(g.model.Name)
	switch t {
	case nvml.CLOCK_SM, nvml.CLOCK_GRAPHICS:
		return uint32(math.Round(float64(p.SMMHz) * cf)), nvml.SUCCESS
	case nvml.CLOCK_MEM:
		return uint32(p.MemMHz), nvml.SUCCESS
	}
	return 0, nvml.ERROR_INVALID_ARGUMENT
}

// TemperatureV1 serves nvmlDeviceGetTemperatureV (version 1, the GPU
// sensor): the die temperature in °C. go-nvml's GetTemperatureV handler
// can only call the C library, so the backend asks a device for this
// method first (nvml.TemperatureReader in pkg/gpu/nvml).
func (d *device) TemperatureV1() (nvml.Temperature, nvml.Return) {
	t := nvml.Temperature{Version: nvml.STRUCT_VERSION(nvml.Temperature{}, 1), SensorType: uint32(nvml.TEMPERATURE_GPU)}
	ret := d.telemetry("GetTemperatureV", func(g *gpuState, r *workload.GPURun) nvml.Return {
		_, _, w, _ := r.LastSecond()
		t.Temperature = int32(math.Round(workload.PowerOf(g.model.Name).Temperature(w)))
		return nvml.SUCCESS
	})
	return t, ret
}

// GetID returns the vGPU instance's NVML handle (the C API's
// nvmlVgpuInstance_t value), as the real binding's handle type carries it.
func (v *vgpuInstance) GetID() uint32 { return v.handle }
