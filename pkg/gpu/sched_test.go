package gpu

import (
	"errors"
	"testing"
	"time"
)

func TestValidateTimeslice(t *testing.T) {
	for _, c := range []struct {
		d  time.Duration
		ok bool
	}{
		{0, true},
		{time.Millisecond, true}, // both ends of the range are legal
		{30 * time.Millisecond, true},
		{6 * time.Millisecond, true},
		{1999 * time.Microsecond, true},
		{time.Nanosecond, false},
		{-time.Millisecond, false},
		{time.Millisecond - time.Microsecond, false},
		{30*time.Millisecond + time.Microsecond, false},
		{1999999 * time.Nanosecond, false}, // not whole microseconds
		{2562047 * time.Hour, false},
	} {
		err := ValidateTimeslice(c.d)
		if (err == nil) != c.ok {
			t.Errorf("ValidateTimeslice(%v) = %v, want ok=%v", c.d, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidateTimeslice(%v) = %v, not ErrInvalid", c.d, err)
		}
	}
}
