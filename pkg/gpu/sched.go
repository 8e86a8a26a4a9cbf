package gpu

import (
	"fmt"
	"time"
)

// Scheduler policies of the time-sliced vGPU scheduler, named as the
// metrics, the API and the command line name them.
const (
	SchedBestEffort = "best_effort"
	SchedEqualShare = "equal_share"
	SchedFixedShare = "fixed_share"
)

// VGPUScheduler is a GPU's time-sliced vGPU scheduler setting: its policy
// and time slice (0: the driver's default).
type VGPUScheduler struct {
	Policy    string        `json:"policy"`
	Timeslice time.Duration `json:"timeslice,omitempty"`
}

// ParseSchedPolicy accepts a policy by its name, with "-" for "_" and
// without the underscore ("best-effort", "besteffort").
func ParseSchedPolicy(s string) (string, error) {
	switch s {
	case SchedBestEffort, "best-effort", "besteffort":
		return SchedBestEffort, nil
	case SchedEqualShare, "equal-share", "equalshare":
		return SchedEqualShare, nil
	case SchedFixedShare, "fixed-share", "fixedshare":
		return SchedFixedShare, nil
	}
	return "", fmt.Errorf("scheduler policy %q: want best_effort, equal_share or fixed_share", s)
}

// The time slice range the vGPU scheduler takes (NVML reports it per GPU
// in GetVgpuSchedulerCapabilities; every vGPU GPU so far reports these,
// the range of the RmPVMRL registry key). Both ends are legal.
const (
	MinTimeslice = time.Millisecond
	MaxTimeslice = 30 * time.Millisecond
)

// ValidateTimeslice checks a time slice before anything is asked of the
// driver: 0 (the driver's default) or MinTimeslice..MaxTimeslice
// inclusive, in whole microseconds (the unit the D-Bus API carries, so a
// finer value could not be shown as the driver holds it). Every caller
// that will send a time slice to the driver (the manager's scheduler
// method, apply's pre-flight) checks it here, so they cannot disagree. A
// refusal is a *TimesliceError, which wraps ErrInvalid.
func ValidateTimeslice(d time.Duration) error {
	switch {
	case d == 0:
		return nil
	case d < MinTimeslice || d > MaxTimeslice:
		return &TimesliceError{Timeslice: d}
	case d%time.Microsecond != 0:
		return &TimesliceError{Timeslice: d, Fraction: true}
	}
	return nil
}

// TimesliceError is a time slice the scheduler cannot take; its message
// names the value and what is wrong with it, without the sentinel's text,
// so that callers that add their own context say it once.
type TimesliceError struct {
	Timeslice time.Duration
	// Fraction: within the range, but not whole microseconds.
	Fraction bool
}

func (e *TimesliceError) Error() string {
	if e.Fraction {
		return fmt.Sprintf("time slice %v: give whole microseconds (%v..%v; leave it out for the driver's default)",
			e.Timeslice, MinTimeslice, MaxTimeslice)
	}
	return fmt.Sprintf("time slice %v is outside the vGPU scheduler's range %v..%v (leave it out for the driver's default)",
		e.Timeslice, MinTimeslice, MaxTimeslice)
}

func (e *TimesliceError) Unwrap() error { return ErrInvalid }
