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
// finer value could not be shown as the driver holds it). The error wraps
// ErrInvalid. Every caller that will send a time slice to the driver (the
// manager's scheduler method, apply's pre-flight) checks it here, so they
// cannot disagree.
func ValidateTimeslice(d time.Duration) error {
	switch {
	case d == 0:
		return nil
	case d < 0:
		return fmt.Errorf("time slice %v: must not be negative (0 keeps the driver's default): %w", d, ErrInvalid)
	case d < MinTimeslice || d > MaxTimeslice:
		return fmt.Errorf("time slice %v: outside %v..%v (0 keeps the driver's default): %w", d, MinTimeslice, MaxTimeslice, ErrInvalid)
	case d%time.Microsecond != 0:
		return fmt.Errorf("time slice %v: give whole microseconds: %w", d, ErrInvalid)
	}
	return nil
}
