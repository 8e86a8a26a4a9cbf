package sim

import (
	"encoding/binary"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML device calls served by the workload model: the vGPU scheduler log,
// utilization, power, clocks, clock event reasons and temperature.

// telemetry runs a read-only call on the GPU's model, advanced to now.
func (d *device) telemetry(op string, fn func(g *gpuState, r *gpuRun) nvml.Return) nvml.Return {
	return d.read(op, func(st *state, g *gpuState) nvml.Return {
		return fn(g, d.h.engine().at(st, g))
	})
}

// GetVgpuSchedulerLog returns the device-level scheduler log: the last 200
// runs, oldest first. NOT_SUPPORTED with MIG on (reference 5.3).
func (d *device) GetVgpuSchedulerLog() (nvml.VgpuSchedulerLog, nvml.Return) {
	var out nvml.VgpuSchedulerLog
	ret := d.telemetry("GetVgpuSchedulerLog", func(g *gpuState, r *gpuRun) nvml.Return {
		if rr := schedSupported(g); rr != nvml.SUCCESS {
			return rr
		}
		out.EngineId = nvml.VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS
		out.SchedulerPolicy, out.ArrMode = g.Sched.Policy, g.Sched.ARR
		binary.LittleEndian.PutUint32(out.SchedulerParams[0:4], g.timeslice())
		out.EntriesCount = uint32(r.log.n)
		for i := 0; i < r.log.n; i++ {
			out.LogEntries[i] = r.log.entries[(r.log.head+i)%logSize]
		}
		return nvml.SUCCESS
	})
	return out, ret
}

// GetVgpuUtilization returns the utilization samples of the running vGPUs
// newer than lastSeen (µs): SM and memory percent per 100 ms sample, as
// unsigned ints. NOT_FOUND when none is newer; NOT_SUPPORTED with MIG on,
// where vGPU activity is not attributed (reference 5.4).
func (d *device) GetVgpuUtilization(lastSeen uint64) (nvml.ValueType, []nvml.VgpuInstanceUtilizationSample, nvml.Return) {
	var out []nvml.VgpuInstanceUtilizationSample
	ret := d.telemetry("GetVgpuUtilization", func(g *gpuState, r *gpuRun) nvml.Return {
		if rr := schedSupported(g); rr != nvml.SUCCESS {
			return rr
		}
		for _, x := range r.order {
			for _, s := range x.samples {
				if s.ts <= lastSeen {
					continue
				}
				out = append(out, utilSampleOf(x.handle, s))
			}
		}
		if len(out) == 0 {
			return nvml.ERROR_NOT_FOUND
		}
		return nvml.SUCCESS
	})
	return nvml.VALUE_TYPE_UNSIGNED_INT, out, ret
}

func utilSampleOf(handle uint32, s utilSample) nvml.VgpuInstanceUtilizationSample {
	v := nvml.VgpuInstanceUtilizationSample{VgpuInstance: handle, TimeStamp: s.ts}
	binary.LittleEndian.PutUint32(v.SmUtil[:4], s.sm)
	binary.LittleEndian.PutUint32(v.MemUtil[:4], s.mem)
	return v
}

// lastSecond averages the GPU's buckets over the last second.
func (r *gpuRun) lastSecond() (busy, mem, watts float64, ok bool) {
	n := len(r.buckets)
	if n == 0 {
		return 0, 0, r.powerW, false
	}
	k := min(n, int(int64(1e9)/bucketNs))
	for _, b := range r.buckets[n-k:] {
		busy += b.busy
		mem += b.mem
	}
	watts = r.powerW
	if n > k {
		first, last := r.buckets[n-k-1], r.buckets[n-1]
		watts = (last.energyMJ - first.energyMJ) / 1e3 / (float64(last.t-first.t) / 1e9)
	}
	return busy / float64(k), mem / float64(k), watts, true
}

// GetUtilizationRates is the whole GPU's busy percent over the last
// second; NOT_SUPPORTED with MIG on (reference 5.4).
func (d *device) GetUtilizationRates() (nvml.Utilization, nvml.Return) {
	var u nvml.Utilization
	ret := d.telemetry("GetUtilizationRates", func(g *gpuState, r *gpuRun) nvml.Return {
		if g.MIGCurrent {
			return nvml.ERROR_NOT_SUPPORTED
		}
		busy, mem, _, _ := r.lastSecond()
		u.Gpu, u.Memory = uint32(math.Round(100*busy)), uint32(math.Round(100*mem))
		return nvml.SUCCESS
	})
	return u, ret
}

// GetPowerUsage is the power draw in milliwatts averaged over the last second.
func (d *device) GetPowerUsage() (uint32, nvml.Return) {
	var mw uint32
	ret := d.telemetry("GetPowerUsage", func(_ *gpuState, r *gpuRun) nvml.Return {
		_, _, w, _ := r.lastSecond()
		mw = uint32(math.Round(w * 1000))
		return nvml.SUCCESS
	})
	return mw, ret
}

// GetTotalEnergyConsumption is the energy drawn since the model started, in mJ.
func (d *device) GetTotalEnergyConsumption() (uint64, nvml.Return) {
	var mj uint64
	ret := d.telemetry("GetTotalEnergyConsumption", func(_ *gpuState, r *gpuRun) nvml.Return {
		mj = uint64(r.energyMJ)
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
		mw = uint32(powerOf(g.model).TDPW * 1000)
		return nvml.SUCCESS
	})
	return mw, ret
}

// GetPowerManagementLimitConstraints returns the settable range, in mW.
func (d *device) GetPowerManagementLimitConstraints() (uint32, uint32, nvml.Return) {
	var lo, hi uint32
	ret := d.read("GetPowerManagementLimitConstraints", func(_ *state, g *gpuState) nvml.Return {
		p := powerOf(g.model)
		lo, hi = uint32(p.minCapW()*1000), uint32(p.TDPW*1000)
		return nvml.SUCCESS
	})
	return lo, hi, ret
}

// SetPowerManagementLimit caps the GPU's power (mW), INVALID_ARGUMENT
// outside the constraints.
func (d *device) SetPowerManagementLimit(mw uint32) nvml.Return {
	return d.write("SetPowerManagementLimit", func(st *state, g *gpuState) (bool, nvml.Return) {
		p := powerOf(g.model)
		w := int(mw / 1000)
		if w < p.minCapW() || w > p.TDPW {
			return false, nvml.ERROR_INVALID_ARGUMENT
		}
		if w == p.TDPW {
			w = 0
		}
		if w == g.PowerCapW {
			return false, nvml.SUCCESS
		}
		d.h.engine().at(st, g)
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
	ret := d.telemetry("GetCurrentClocksEventReasons", func(_ *gpuState, r *gpuRun) nvml.Return {
		m = r.reasons
		return nvml.SUCCESS
	})
	return m, ret
}

// GetCurrentClocksThrottleReasons is the deprecated name of GetCurrentClocksEventReasons.
func (d *device) GetCurrentClocksThrottleReasons() (uint64, nvml.Return) {
	return d.GetCurrentClocksEventReasons()
}

// GetSupportedClocksEventReasons lists the reasons the GPU can report.
func (d *device) GetSupportedClocksEventReasons() (uint64, nvml.Return) {
	ret := d.read("GetSupportedClocksEventReasons", func(*state, *gpuState) nvml.Return { return nvml.SUCCESS })
	return supportedReasons, ret
}

// GetSupportedClocksThrottleReasons is the deprecated name of GetSupportedClocksEventReasons.
func (d *device) GetSupportedClocksThrottleReasons() (uint64, nvml.Return) {
	return d.GetSupportedClocksEventReasons()
}

// GetClockInfo is the current clock in MHz.
func (d *device) GetClockInfo(t nvml.ClockType) (uint32, nvml.Return) {
	var mhz uint32
	ret := d.telemetry("GetClockInfo", func(g *gpuState, r *gpuRun) nvml.Return {
		p := powerOf(g.model)
		switch t {
		case nvml.CLOCK_SM, nvml.CLOCK_GRAPHICS:
			mhz = uint32(math.Round(float64(p.SMMHz) * r.cf))
		case nvml.CLOCK_MEM:
			mhz = uint32(p.MemMHz)
		default:
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.SUCCESS
	})
	return mhz, ret
}

// GetMaxClockInfo is the maximum clock in MHz.
func (d *device) GetMaxClockInfo(t nvml.ClockType) (uint32, nvml.Return) {
	var mhz uint32
	ret := d.read("GetMaxClockInfo", func(_ *state, g *gpuState) nvml.Return {
		p := powerOf(g.model)
		switch t {
		case nvml.CLOCK_SM, nvml.CLOCK_GRAPHICS:
			mhz = uint32(p.SMMHz)
		case nvml.CLOCK_MEM:
			mhz = uint32(p.MemMHz)
		default:
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.SUCCESS
	})
	return mhz, ret
}

// GetTemperature is the die temperature in °C.
func (d *device) GetTemperature(s nvml.TemperatureSensors) (uint32, nvml.Return) {
	var c uint32
	ret := d.telemetry("GetTemperature", func(g *gpuState, r *gpuRun) nvml.Return {
		if s != nvml.TEMPERATURE_GPU {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		_, _, w, _ := r.lastSecond()
		c = uint32(math.Round(temperature(powerOf(g.model), w)))
		return nvml.SUCCESS
	})
	return c, ret
}

// GetID returns the vGPU instance's NVML handle (the C API's
// nvmlVgpuInstance_t value), as the real binding's handle type carries it.
func (v *vgpuInstance) GetID() uint32 { return v.handle }
