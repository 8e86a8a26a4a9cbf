package fleet

import (
	"testing"
	"time"
)

// TestBackoffJitter: each wait after a failed pass lies in the upper half
// of the doubling wait (1 s, 2 s, 4 s …, never past the interval), where
// the random source puts it; a success starts again from 1 s.
func TestBackoffJitter(t *testing.T) {
	r := 0.0
	b := newBackoff(10*time.Second, func() float64 { return r })
	for i, want := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second} {
		if got := b.next(); got != want {
			t.Fatalf("failure %d with draw 0: wait %s, want %s", i+1, got, want)
		}
	}
	b.reset()
	r = 0.5
	for i, want := range []time.Duration{750 * time.Millisecond, 1500 * time.Millisecond, 3 * time.Second, 6 * time.Second, 7500 * time.Millisecond} {
		if got := b.next(); got != want {
			t.Fatalf("failure %d with draw 0.5: wait %s, want %s", i+1, got, want)
		}
	}
}

// TestBackoffSpreads: hosts that met the same outage, each with its own
// draws, do not retry at one moment; every wait stays within the
// interval.
func TestBackoffSpreads(t *testing.T) {
	const interval = time.Minute
	seen := map[time.Duration]bool{}
	for range 50 {
		b := newBackoff(interval, nil)
		for i := range 8 {
			d := b.next()
			if d <= 0 || d > interval {
				t.Fatalf("wait %s after failure %d: outside (0, %s]", d, i+1, interval)
			}
			if i == 2 {
				seen[d] = true
			}
		}
	}
	if len(seen) < 40 {
		t.Fatalf("50 hosts' third retries fell on %d distinct moments: not spread", len(seen))
	}
}
