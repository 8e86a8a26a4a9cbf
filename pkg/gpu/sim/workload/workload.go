package workload

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Workload kinds (see Workload).
const (
	// Idle submits nothing.
	Idle = "idle"
	// Steady submits work at a constant rate in short kernels.
	Steady = "steady"
	// Bursty alternates seeded random on and off periods; Demand is its mean.
	Bursty = "bursty"
	// Noisy wants the whole GPU, in long, power-hungry kernels: the
	// noisy neighbour.
	Noisy = "noisy"
)

// ErrInvalid is wrapped by the errors of WithDefaults and
// Calibration.Validate.
var ErrInvalid = errors.New("invalid workload")

// Workload is the demand model of one vGPU or MIG GPU instance: the work it
// submits over time, as the fraction of the whole GPU's compute at full
// clock it would use if nothing held it back. The engine serves that work
// by the GPU's policy; what it could not serve is the interference the
// share loop measures.
//
// In the simulator a vGPU's workload runs only while a VM has the vGPU open
// (Host.OpenDevice); a MIG GPU instance's runs whenever it is set
// (bare-metal jobs).
type Workload struct {
	// Kind is idle, steady, bursty or noisy.
	Kind string `json:"kind"`
	// Demand is the mean demand in [0,1] of a whole GPU (0: the kind's default).
	Demand float64 `json:"demand"`
	// KernelNs is the length of one kernel at full clock. The best-effort
	// scheduler preempts only between kernels, so long kernels overrun
	// their time slice (0: the kind's default).
	KernelNs int64 `json:"kernelNs,omitempty"`
	// PeriodNs and Duty shape a bursty workload: on and off periods average
	// PeriodNs*Duty and PeriodNs*(1-Duty) (0: defaults 400ms, 0.4).
	PeriodNs int64   `json:"periodNs,omitempty"`
	Duty     float64 `json:"duty,omitempty"`
	// Power is the power drawn per unit of compute, 1 being typical
	// (0: the kind's default).
	Power float64 `json:"power,omitempty"`
	// FB is the framebuffer in use as a fraction of the instance's (0: the kind's default).
	FB float64 `json:"fb,omitempty"`
	// Seed makes a bursty trace reproducible.
	Seed uint64 `json:"seed,omitempty"`
	// StartNs is the simulated time the workload was set: its trace starts there.
	StartNs int64 `json:"startNs,omitempty"`
}

// WithDefaults fills the kind's defaults from cal and validates the
// result; its errors wrap ErrInvalid.
func (w Workload) WithDefaults(cal Calibration) (Workload, error) {
	bad := func(format string, a ...any) (Workload, error) {
		return w, fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	switch w.Kind {
	case Idle:
		w.Demand = 0
		if w.FB == 0 {
			w.FB = 0.05
		}
	case Steady, Bursty:
		if w.Demand == 0 {
			w.Demand = 0.2
		}
		if w.KernelNs == 0 {
			w.KernelNs = int64(cal.Kernel)
		}
		if w.Power == 0 {
			w.Power = 1
		}
		if w.FB == 0 {
			w.FB = 0.5
		}
		if w.Kind == Bursty {
			if w.PeriodNs == 0 {
				w.PeriodNs = int64(400 * time.Millisecond)
			}
			if w.Duty == 0 {
				w.Duty = 0.4
			}
		}
	case Noisy:
		if w.Demand == 0 {
			w.Demand = 1
		}
		if w.KernelNs == 0 {
			w.KernelNs = int64(cal.NoisyKernel)
		}
		if w.Power == 0 {
			w.Power = cal.NoisyPower
		}
		if w.FB == 0 {
			w.FB = 0.9
		}
	default:
		return bad("kind %q: want idle, steady, bursty or noisy", w.Kind)
	}
	switch {
	case math.IsNaN(w.Demand) || w.Demand < 0 || w.Demand > 1:
		return bad("demand %v: want a fraction of the GPU in [0,1]", w.Demand)
	case w.KernelNs < 0 || w.KernelNs > int64(time.Second):
		return bad("kernel %v: want 0..1s", time.Duration(w.KernelNs))
	case w.PeriodNs < 0 || w.PeriodNs > int64(time.Hour):
		return bad("period %v: want 0..1h", time.Duration(w.PeriodNs))
	case w.Duty < 0 || w.Duty > 1:
		return bad("duty %v: want [0,1]", w.Duty)
	case w.Kind == Bursty && w.Duty == 0:
		return bad("duty 0 leaves a bursty workload no on time")
	case w.Power < 0 || w.Power > 3:
		return bad("power %v: want 0..3", w.Power)
	case w.FB < 0 || w.FB > 1:
		return bad("fb %v: want a fraction in [0,1]", w.FB)
	}
	if w.Kind == Bursty && w.Demand > w.Duty {
		return bad("bursty demand %v exceeds its duty %v (the on level would pass a whole GPU)", w.Demand, w.Duty)
	}
	return w, nil
}
