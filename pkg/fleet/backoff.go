package fleet

import (
	"math/rand/v2"
	"time"
)

// backoff spaces the passes after failed ones. The wait doubles from 1 s
// and never passes the interval (retryAfter); each wait is drawn at random
// in its upper half. Without the draw, every host that met the same
// outage retries at the same moments (1 s, 3 s, 7 s … after it), and a
// Placement that comes back meets the whole fleet's republish at once;
// drawn, the retries spread over half of each wait, while a host still
// retries within the interval however long Placement was gone.
type backoff struct {
	interval time.Duration
	// rand is in [0, 1): Config.Rand, math/rand/v2's Float64 by default.
	rand func() float64
	// prev is the undrawn wait of the last retry (0: none since the last
	// success).
	prev time.Duration
}

func newBackoff(interval time.Duration, rnd func() float64) *backoff {
	if rnd == nil {
		rnd = rand.Float64
	}
	return &backoff{interval: interval, rand: rnd}
}

// next is the wait before the next pass after one more failure.
func (b *backoff) next() time.Duration {
	b.prev = retryAfter(b.prev, b.interval)
	half := b.prev / 2
	return half + time.Duration(b.rand()*float64(b.prev-half))
}

// reset starts again from 1 s: the last pass succeeded.
func (b *backoff) reset() { b.prev = 0 }
