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

// A pin is held as the settable slice nearest to the one asked, inside
// the range: what apply and the manager compare a wanted slice with.
func TestSettableTimeslice(t *testing.T) {
	for ts, want := range map[time.Duration]time.Duration{
		0:                       0,
		MinTimeslice:            MinTimeslice,
		MaxTimeslice:            time.Second / 34,
		6 * time.Millisecond:    time.Second / 167,
		1999 * time.Microsecond: 2 * time.Millisecond,
		4 * time.Millisecond:    4 * time.Millisecond,
	} {
		if got := SettableTimeslice(ts); got != want {
			t.Errorf("SettableTimeslice(%v) = %v, want %v", ts, got, want)
		}
		if got := SettableTimeslice(SettableTimeslice(ts)); got != SettableTimeslice(ts) {
			t.Errorf("SettableTimeslice is not stable at %v: %v", ts, got)
		}
	}
}
