package sim

import (
	"errors"
	"fmt"
	"time"
)

// ErrRealTime is returned by Advance while the model follows the wall clock.
var ErrRealTime = errors.New("the simulated clock follows real time (call UseManualClock first)")

// UseManualClock stops the workload model's clock from following the wall
// clock: from now on only Advance moves it. It starts at a fixed instant
// (2026-01-01 UTC) so that runs are reproducible. Everything the model
// held is reset.
func (h *Host) UseManualClock() error {
	return h.view(func(*state) error {
		cal := h.engine().cal
		h.eng = newEngine()
		h.eng.cal = cal
		h.eng.manual, h.eng.now = true, manualEpoch
		return nil
	})
}

// SetCalibration replaces the workload model's constants (DefaultCalibration
// is what a host starts with); the model restarts.
func (h *Host) SetCalibration(c Calibration) error {
	if c.Timeslice <= 0 || c.Kernel <= 0 || c.NoisyKernel <= 0 || c.BacklogCap <= 0 || c.PowerExponent <= 0 ||
		c.MIGPower <= 0 || c.TimeSlicedOccupancy <= 0 || c.SwitchCost < 0 {
		return fmt.Errorf("%w: calibration %+v has a non-positive constant", ErrBadWorkload, c)
	}
	return h.view(func(*state) error {
		manual, now := h.engine().manual, h.engine().now
		h.eng = newEngine()
		h.eng.cal, h.eng.manual, h.eng.now = c, manual, now
		return nil
	})
}

// Calibration returns the workload model's constants.
func (h *Host) Calibration() Calibration {
	var c Calibration
	_ = h.view(func(*state) error { c = h.engine().cal; return nil })
	return c
}

// Advance moves the manual clock by d, simulating every GPU on the way.
func (h *Host) Advance(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("advance by %v: negative", d)
	}
	return h.view(func(st *state) error {
		e := h.engine()
		if !e.manual {
			return ErrRealTime
		}
		e.now += int64(d)
		e.advance(st)
		return nil
	})
}

// Now is the workload model's current time.
func (h *Host) Now() time.Time {
	var t int64
	_ = h.view(func(*state) error { t = h.engine().clock(); return nil })
	return time.Unix(0, t)
}

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
	Instances map[string]InstanceTruth // by workload key (mdev UUID, VF, GPU-UUID/giN)
}

// Truth returns the ground truth now (advancing the model to now).
func (h *Host) Truth() (Truth, error) {
	out := Truth{GPUs: map[string]GPUTruth{}, Instances: map[string]InstanceTruth{}}
	err := h.view(func(st *state) error {
		e := h.engine()
		out.Time = time.Unix(0, e.advance(st))
		for id, r := range e.gpus {
			out.GPUs[id] = GPUTruth{Busy: r.busy, EnergyMJ: r.energyMJ, Throttle: r.throttle, ClockFactor: r.cf, PowerW: r.powerW, LogEntries: r.log.total}
		}
		for k, t := range e.truth {
			out.Instances[k] = InstanceTruth{GPU: t.gpu, GI: t.gi, Handle: t.handle, Active: t.active, Demand: t.demand, Work: t.work,
				Run: t.run, Dropped: t.dropped, Throttle: t.throttle, Runs: t.runs, Preemptions: t.preempts}
		}
		return nil
	})
	return out, err
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
