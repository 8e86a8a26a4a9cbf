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

// The time slice range of the equal- and fixed-share vGPU schedulers, as
// NVIDIA documents it and the driver's scheduler capabilities report it
// (GetVgpuSchedulerCapabilities' MinTimeslice and MaxTimeslice): both
// bounds are valid settings.
const (
	MinTimeslice = time.Millisecond
	MaxTimeslice = 30 * time.Millisecond
)

// CheckTimeslice is the one check of a time slice an operator or a layout
// asks for, before anything is sent to the driver: 0 (the driver's
// default) or MinTimeslice..MaxTimeslice inclusive. A refusal is a
// *TimesliceError, which wraps ErrInvalid.
func CheckTimeslice(ts time.Duration) error {
	if ts == 0 || (ts >= MinTimeslice && ts <= MaxTimeslice) {
		return nil
	}
	return &TimesliceError{Timeslice: ts}
}

// TimesliceError is a time slice outside the scheduler's range; its
// message names the value and the range.
type TimesliceError struct {
	Timeslice time.Duration
}

func (e *TimesliceError) Error() string {
	return fmt.Sprintf("time slice %v is outside the vGPU scheduler's range %v..%v (leave it out for the driver's default)",
		e.Timeslice, MinTimeslice, MaxTimeslice)
}

func (e *TimesliceError) Unwrap() error { return ErrInvalid }
