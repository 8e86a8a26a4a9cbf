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

// SliceWithin is the time slice NVML's _v2 scheduler call can set nearest
// to ts: the call takes a frequency in whole Hz, so the slice is 1 s over
// the nearest whole Hz, moved to the next such slice inside lo..hi (a
// bound of 0: none) when the nearest falls outside it (30 ms, 33.3 Hz, is
// set as 34 Hz: 29.41 ms, not 33 Hz: 30.3 ms, which the driver refuses).
// 0 stays 0 (the driver's default).
func SliceWithin(ts, lo, hi time.Duration) time.Duration {
	if ts <= 0 {
		return 0
	}
	f := max(1, (time.Second+ts/2)/ts)
	for hi > 0 && time.Second/f > hi {
		f++
	}
	for lo > 0 && f > 1 && time.Second/f < lo {
		f--
	}
	return time.Second / f
}

// SettableTimeslice is the time slice the driver holds after a pin asked
// for ts (SliceWithin the documented range), which is what vgpud records
// and shows for the pin: compare a wanted slice with a held one through
// it (a layout asking 6ms is held as 5.988023ms).
func SettableTimeslice(ts time.Duration) time.Duration {
	return SliceWithin(ts, MinTimeslice, MaxTimeslice)
}
