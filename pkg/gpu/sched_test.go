package gpu_test

import (
	"errors"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// The documented range is accepted inclusive, 0 is the driver's default,
// and everything else is refused as ErrInvalid, naming the value.
func TestCheckTimeslice(t *testing.T) {
	for _, ok := range []time.Duration{0, gpu.MinTimeslice, 2 * time.Millisecond, 1999999, gpu.MaxTimeslice} {
		if err := gpu.CheckTimeslice(ok); err != nil {
			t.Errorf("%v: %v", ok, err)
		}
	}
	for _, bad := range []time.Duration{1, -time.Millisecond, gpu.MinTimeslice - 1, gpu.MaxTimeslice + 1, 2562047 * time.Hour} {
		err := gpu.CheckTimeslice(bad)
		if !errors.Is(err, gpu.ErrInvalid) {
			t.Errorf("%v: %v, want ErrInvalid", bad, err)
		}
		var te *gpu.TimesliceError
		if !errors.As(err, &te) || te.Timeslice != bad {
			t.Errorf("%v: %v, want a TimesliceError naming it", bad, err)
		}
	}
}
