package workload

import "time"

// ReasonName names the clock event reason at index i of the Truth
// throttle arrays ("gpu_idle", "sw_power_cap"), and ReasonBit is its NVML
// clock event reason bit.
func ReasonName(i int) string { return [nReasons]string{"gpu_idle", "sw_power_cap"}[i] }

// ReasonBit returns the NVML clock event reason bit of index i.
func ReasonBit(i int) uint64 { return reasonBits[i] }

// InstanceTruth is what one instance really got, cumulative since the
// model started. Times are simulated nanoseconds; work is measured at full
// clock, so Work/elapsed is the instance's achieved share of the GPU.
type InstanceTruth struct {
	// GPU is the GPU's UUID, GI the GPU instance (-1 time-sliced), Handle
	// the vGPU's NVML handle (0 for a MIG GPU instance).
	GPU    string
	GI     int
	Handle uint32
	// Active: the instance is running now (VM open, or MIG workload set).
	Active bool
	// Demand is the work submitted, Work the work served, Run the time it
	// ran (time-sliced) or its slices were busy (MIG), Dropped the work lost.
	Demand, Work, Run, Dropped float64
	// Throttle is the time it ran while the GPU's clocks were held back,
	// by reason (ReasonName).
	Throttle [nReasons]float64
	// Runs and Preemptions count scheduler log entries and the runs the
	// scheduler ended with work left.
	Runs, Preemptions int64
}

// GPUTruth is one GPU's model state, cumulative.
type GPUTruth struct {
	// Busy is the time the GPU was busy (weighted by the busy share of its
	// slices under MIG).
	Busy float64
	// EnergyMJ is the energy drawn in millijoules.
	EnergyMJ float64
	// Throttle is the time each reason was raised (ReasonName).
	Throttle [nReasons]float64
	// ClockFactor and PowerW are the current clock (1 = full) and power.
	ClockFactor, PowerW float64
	// LogEntries counts the scheduler log entries written.
	LogEntries uint64
}

// Truth is the model's ground truth at one time.
type Truth struct {
	Time      time.Time
	GPUs      map[string]GPUTruth      // by GPU UUID
	Instances map[string]InstanceTruth // by Instance.Key
}

// Truth returns the ground truth at now, the time of the last Advance.
func (e *Engine) Truth(now int64) Truth {
	out := Truth{Time: time.Unix(0, now), GPUs: map[string]GPUTruth{}, Instances: map[string]InstanceTruth{}}
	for id, r := range e.gpus {
		out.GPUs[id] = GPUTruth{Busy: r.busy, EnergyMJ: r.energyMJ, Throttle: r.throttle, ClockFactor: r.cf, PowerW: r.powerW, LogEntries: r.log.total}
	}
	for k, t := range e.truth {
		out.Instances[k] = InstanceTruth{GPU: t.gpu, GI: t.gi, Handle: t.handle, Active: t.active, Demand: t.demand, Work: t.work,
			Run: t.run, Dropped: t.dropped, Throttle: t.throttle, Runs: t.runs, Preemptions: t.preempts}
	}
	return out
}

// Shares is one instance's truth over an interval, as fractions of the
// GPU (Achieved, Demand, Busy) and seconds (Throttle).
type Shares struct {
	Achieved, Demand, Busy float64
	Throttle               [nReasons]float64
	Preemptions            int64
}

// Between returns key's shares over the interval from prev to t. An
// instance unknown at prev counts from zero.
func (t Truth) Between(prev Truth, key string) Shares {
	dt := float64(t.Time.Sub(prev.Time))
	if dt <= 0 {
		return Shares{}
	}
	a, b := t.Instances[key], prev.Instances[key]
	s := Shares{Achieved: (a.Work - b.Work) / dt, Demand: (a.Demand - b.Demand) / dt, Busy: (a.Run - b.Run) / dt,
		Preemptions: a.Preemptions - b.Preemptions}
	for i := range s.Throttle {
		s.Throttle[i] = (a.Throttle[i] - b.Throttle[i]) / 1e9
	}
	return s
}
