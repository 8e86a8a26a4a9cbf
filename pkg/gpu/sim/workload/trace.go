package workload

import (
	"math"
	"time"
)

// Demand traces: how much work each instance submits over time.

func splitmix(x *uint64) uint64 {
	*x += 0x9e3779b97f4a7c15
	z := *x
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func fnv(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// initTrace positions the instance's demand trace at time t. A bursty
// trace is generated from the workload's start, so it does not depend on
// when the model first looked at it.
func (x *instRun) initTrace(t int64) {
	x.level, x.next = x.w.Demand, math.MaxInt64
	if x.w.Kind != Bursty {
		return
	}
	x.rng = x.w.Seed ^ fnv(x.key)
	x.on = false
	x.next = x.w.StartNs
	for x.next <= t {
		x.step()
	}
}

func (x *instRun) step() {
	x.on = !x.on
	mean := float64(x.w.PeriodNs) * (1 - x.w.Duty)
	x.level = 0
	if x.on {
		mean = float64(x.w.PeriodNs) * x.w.Duty
		x.level = x.w.Demand / x.w.Duty
	}
	u := (float64(splitmix(&x.rng)>>11) + 0.5) / (1 << 53)
	d := int64(-math.Log(u) * mean)
	if d < int64(time.Millisecond) {
		d = int64(time.Millisecond)
	}
	x.next += d
}

func (r *GPURun) nextTrace() int64 {
	n := int64(math.MaxInt64)
	for _, x := range r.order {
		if x.next < n {
			n = x.next
		}
	}
	return n
}

// traceStep applies the trace changes due at r.t and reports whether any
// demand changed.
func (r *GPURun) traceStep() bool {
	changed := false
	for _, x := range r.order {
		for x.next <= r.t {
			x.step()
			r.segValid = false
			changed = true
		}
	}
	return changed
}
