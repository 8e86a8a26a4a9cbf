package workload

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Calibration holds the workload model's constants. The defaults are set
// so that the model reproduces published isolation figures (see
// docs/metrics.md, "Calibration"):
//
//   - time slicing: a noisy neighbour costs a victim running at 80% of its
//     fixed share about 25% of its throughput under the best-effort
//     scheduler (NoisyKernel), and a victim using all of its share about 40%
//     (its interference index);
//   - MIG: compute is hardware-isolated, so neighbours cost a victim only
//     what shared power costs it: about 1.5% next to six power-hungry
//     neighbours at the default power limit (MIGPower, NoisyPower), within
//     the 5% MIG isolation error.
type Calibration struct {
	// Kernel is the default kernel length of steady and bursty workloads.
	Kernel time.Duration
	// NoisyKernel is the noisy neighbour's kernel length: best effort
	// cannot preempt it mid-kernel, so it overruns its time slice.
	NoisyKernel time.Duration
	// NoisyPower is the noisy neighbour's power per unit of compute.
	NoisyPower float64
	// Timeslice is the driver's default time slice.
	Timeslice time.Duration
	// SwitchCost is the GPU time a context switch between vGPUs costs.
	SwitchCost time.Duration
	// BacklogCap bounds a starved vGPU's queued work; what arrives beyond
	// it is lost (requests time out), which is the throughput a victim loses.
	BacklogCap time.Duration
	// MIGPower is the dynamic power of a fully busy MIG GPU at full clock,
	// at power 1, as a fraction of (TDP - idle).
	MIGPower float64
	// TimeSlicedOccupancy is the fraction of the SMs one time-sliced context
	// keeps busy (a single VM rarely fills a whole GPU as seven MIG jobs do),
	// which scales its power.
	TimeSlicedOccupancy float64
	// PowerExponent is how dynamic power scales with the clock (P ~ f^k,
	// voltage following frequency).
	PowerExponent float64
}

// DefaultCalibration returns the calibrated defaults.
func DefaultCalibration() Calibration {
	return Calibration{
		Kernel:              500 * time.Microsecond,
		NoisyKernel:         4600 * time.Microsecond,
		NoisyPower:          1.15,
		Timeslice:           2 * time.Millisecond,
		SwitchCost:          25 * time.Microsecond,
		BacklogCap:          50 * time.Millisecond,
		MIGPower:            0.92,
		TimeSlicedOccupancy: 0.9,
		PowerExponent:       2.5,
	}
}

// Validate checks that every constant is positive (SwitchCost may be
// zero); it wraps ErrInvalid.
func (c Calibration) Validate() error {
	if c.Timeslice <= 0 || c.Kernel <= 0 || c.NoisyKernel <= 0 || c.BacklogCap <= 0 || c.PowerExponent <= 0 ||
		c.MIGPower <= 0 || c.TimeSlicedOccupancy <= 0 || c.SwitchCost < 0 {
		return fmt.Errorf("%w: calibration %+v has a non-positive constant", ErrInvalid, c)
	}
	return nil
}

// Power is a GPU model's power and clock figures: its board power (TDP)
// and idle draw in watts, and its maximum SM and memory clocks in MHz.
type Power struct {
	TDPW   int
	IdleW  float64
	SMMHz  int
	MemMHz int
}

// MinCapW is the lowest power limit the board accepts, in watts.
func (p Power) MinCapW() int { return p.TDPW / 2 }

// powers holds public board figures (TDP, max boost SM clock) per
// catalog family; the idle draw is a plausible figure, not published.
var powers = []struct {
	prefix string
	p      Power
}{
	{"H100", Power{TDPW: 700, IdleW: 70, SMMHz: 1980, MemMHz: 2619}},
	{"H200", Power{TDPW: 700, IdleW: 75, SMMHz: 1980, MemMHz: 3201}},
	{"B200", Power{TDPW: 1000, IdleW: 120, SMMHz: 1965, MemMHz: 3996}},
	{"A100", Power{TDPW: 400, IdleW: 55, SMMHz: 1410, MemMHz: 1593}},
	{"A30", Power{TDPW: 165, IdleW: 30, SMMHz: 1440, MemMHz: 1215}},
	{"A10", Power{TDPW: 150, IdleW: 25, SMMHz: 1695, MemMHz: 6251}},
	{"L40S", Power{TDPW: 350, IdleW: 35, SMMHz: 2520, MemMHz: 9001}},
	{"L4", Power{TDPW: 72, IdleW: 16, SMMHz: 2040, MemMHz: 6251}},
	{"T4", Power{TDPW: 70, IdleW: 10, SMMHz: 1590, MemMHz: 5001}},
	{"RTX", Power{TDPW: 600, IdleW: 40, SMMHz: 2617, MemMHz: 14001}},
}

// PowerOf returns the figures of the GPU model called name (a catalog
// model name, "H100-SXM5-80GB"), by its family; a plausible default for a
// family it does not know.
func PowerOf(name string) Power {
	for _, e := range powers {
		if strings.HasPrefix(name, e.prefix) {
			return e.p
		}
	}
	return Power{TDPW: 300, IdleW: 40, SMMHz: 1800, MemMHz: 5001}
}

// clockFor returns the clock factor (f/fmax, 1 = full clock) at which
// power(cf) fits the limit. power must be non-decreasing in cf; power(1)
// within the limit means full clock.
func clockFor(limit float64, power func(cf float64) float64) float64 {
	if power(1) <= limit {
		return 1
	}
	const floor = 0.2
	lo, hi := floor, 1.0
	if power(lo) > limit {
		return floor
	}
	for i := 0; i < 40; i++ {
		mid := (lo + hi) / 2
		if power(mid) > limit {
			hi = mid
		} else {
			lo = mid
		}
	}
	return lo
}

// tsRunPower is the power while one time-sliced context runs at clock
// factor cf with power intensity w, busy for the fraction busy of the time.
func tsRunPower(p Power, cal Calibration, w, busy, cf float64) float64 {
	return p.IdleW + (float64(p.TDPW)-p.IdleW)*cal.MIGPower*cal.TimeSlicedOccupancy*w*busy*math.Pow(cf, cal.PowerExponent)
}

// Temperature is the steady-state die temperature, in °C, at power watts.
func (p Power) Temperature(watts float64) float64 {
	return 28 + 52*watts/float64(p.TDPW)
}
