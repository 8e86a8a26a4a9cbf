package workload

import (
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The time-sliced scheduler (the policies are described in engine.go).

type tsPhase int

const (
	phaseNone   tsPhase = iota // decide at the current time
	phaseIdle                  // nothing runnable (best effort) until wake
	phaseSwitch                // context switch to runner until switchEnd
	phaseRun                   // runner runs
	phaseSlot                  // strict slot with nobody running until slotEnd
)

type tsSlot struct {
	inst *instRun // nil: an idle slot (the share of absent vGPUs)
	len  int64
}

type tsSched struct {
	phase     tsPhase
	runner    *instRun
	last      *instRun // context last on the GPU
	wake      int64
	switchEnd int64
	runStart  int64
	kernelEnd int64
	runAcc    float64 // ns run in this run (strict trickle counts partially)
	target    int64
	cf        float64
	slotEnd   int64
	slots     []tsSlot
	slot      int
	cursor    int
}

func (r *GPURun) strict() bool {
	return r.policy == nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE || r.policy == nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE
}

func (r *GPURun) kernel(x *instRun) float64 {
	if x.w.KernelNs > 0 {
		return float64(x.w.KernelNs)
	}
	return float64(r.e.cal.Kernel)
}

// runClock is the clock factor while x runs alone on the GPU.
func (r *GPURun) runClock(x *instRun) float64 {
	w := x.w.Power
	if w == 0 {
		w = 1
	}
	cal := r.e.cal
	return clockFor(r.capW, func(cf float64) float64 { return tsRunPower(r.pm, cal, w, 1, cf) })
}

func (r *GPURun) buildSlots() {
	ts := r.timeslice
	r.sch.slots = r.sch.slots[:0]
	if len(r.order) == 0 {
		return
	}
	if r.policy == nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE {
		for _, x := range r.order {
			r.sch.slots = append(r.sch.slots, tsSlot{inst: x, len: ts})
		}
		return
	}
	minShare, sum := math.Inf(1), 0.0
	for _, x := range r.order {
		if x.share > 0 && x.share < minShare {
			minShare = x.share
		}
		sum += x.share
	}
	if math.IsInf(minShare, 1) {
		minShare = 1
	}
	cycle := float64(ts) / minShare
	for _, x := range r.order {
		r.sch.slots = append(r.sch.slots, tsSlot{inst: x, len: int64(math.Round(cycle * x.share))})
	}
	if idle := int64(math.Round(cycle * (1 - sum))); idle > 0 {
		r.sch.slots = append(r.sch.slots, tsSlot{len: idle})
	}
}

// schedule decides what the GPU does from r.t on.
func (r *GPURun) schedule() {
	s := &r.sch
	s.runner = nil
	if len(r.order) == 0 {
		s.phase, s.wake = phaseIdle, math.MaxInt64
		return
	}
	if r.strict() {
		if len(s.slots) == 0 {
			r.buildSlots()
			s.slot = -1
		}
		s.slot = (s.slot + 1) % len(s.slots)
		sl := s.slots[s.slot]
		s.slotEnd = r.t + sl.len
		x := sl.inst
		if x == nil || (x.backlog <= 0 && x.level == 0) {
			s.phase = phaseSlot
			return
		}
		s.runner = x
		s.target = sl.len
		s.cf = r.runClock(x)
		if s.last != x {
			cost := int64(r.e.cal.SwitchCost)
			if cost > sl.len {
				cost = sl.len
			}
			s.target -= cost
			s.phase, s.switchEnd = phaseSwitch, r.t+cost
			x.preemptTotal += cost
			return
		}
		r.startRun()
		return
	}
	// Best effort: the next vGPU after the cursor with a kernel queued.
	n := len(r.order)
	for i := 1; i <= n; i++ {
		x := r.order[(s.cursor+i)%n]
		if x.backlog >= r.kernel(x) {
			s.cursor = (s.cursor + i) % n
			s.runner = x
			s.target = r.timeslice
			s.cf = r.runClock(x)
			if s.last != x {
				s.phase, s.switchEnd = phaseSwitch, r.t+int64(r.e.cal.SwitchCost)
				x.preemptTotal += int64(r.e.cal.SwitchCost)
				return
			}
			r.startRun()
			return
		}
	}
	s.phase, s.wake = phaseIdle, math.MaxInt64
	for _, x := range r.order {
		if x.level <= 0 {
			continue
		}
		need := r.kernel(x) - x.backlog
		w := r.t + int64(math.Ceil(need/x.level))
		if w <= r.t {
			w = r.t + 1
		}
		if w < s.wake {
			s.wake = w
		}
	}
}

func (r *GPURun) startRun() {
	s := &r.sch
	s.phase, s.runStart, s.runAcc = phaseRun, r.t, 0
	s.last = s.runner
	if !r.strict() {
		r.takeKernel()
	}
}

// takeKernel starts the runner's next kernel (best effort).
func (r *GPURun) takeKernel() {
	s := &r.sch
	k := r.kernel(s.runner)
	s.runner.backlog -= k
	d := int64(math.Ceil(k / s.cf))
	if d < 1 {
		d = 1
	}
	s.kernelEnd = r.t + d
}

// event is when the scheduler acts next.
func (r *GPURun) event() int64 {
	s := &r.sch
	switch s.phase {
	case phaseIdle:
		return s.wake
	case phaseSwitch:
		return s.switchEnd
	case phaseSlot:
		return s.slotEnd
	case phaseRun:
		if !r.strict() {
			return s.kernelEnd
		}
		x := s.runner
		if x.backlog > 0 && s.cf > x.level {
			y := r.t + int64(math.Ceil(x.backlog/(s.cf-x.level)))
			if y <= r.t {
				y = r.t + 1
			}
			if y < s.slotEnd {
				return y
			}
		}
		return s.slotEnd
	}
	return r.t
}

// fire performs the scheduler's action due at r.t.
func (r *GPURun) fire() {
	s := &r.sch
	switch s.phase {
	case phaseIdle, phaseSlot:
		s.phase = phaseNone
	case phaseSwitch:
		r.startRun()
	case phaseRun:
		x := s.runner
		if !r.strict() {
			elapsed := r.t - s.runStart
			switch {
			case elapsed >= s.target:
				r.finishRun(true)
			case x.backlog >= r.kernel(x):
				r.takeKernel()
			default:
				r.finishRun(false)
			}
			return
		}
		if r.t >= s.slotEnd {
			r.finishRun(x.backlog > 1)
			return
		}
		// Backlog drained inside the slot: the runner keeps the slot and
		// serves arrivals as they come (trickle) until the slot ends.
		if x.backlog < 0 || x.backlog < 1e-6 {
			x.backlog = 0
		}
	}
}

// finishRun writes the run's scheduler log entry.
func (r *GPURun) finishRun(preempted bool) {
	s := &r.sch
	x := s.runner
	run := int64(math.Round(s.runAcc))
	if !r.strict() {
		run = r.t - s.runStart
	}
	if run > 0 {
		x.runTotal += run
		r.log.add(nvml.VgpuSchedulerLogEntry{
			Timestamp: uint64(r.t), TimeRunTotal: uint64(x.runTotal), TimeRun: uint64(run), SwRunlistId: x.handle,
			TargetTimeSlice: uint64(s.target), CumulativePreemptionTime: uint64(x.preemptTotal),
		})
		x.t.runs++
		if preempted {
			x.t.preempts++
		}
	}
	s.runner = nil
	s.phase = phaseNone
}

// endRun closes a run cut short by a configuration change.
func (r *GPURun) endRun() {
	if r.sch.runner != nil && r.sch.phase == phaseRun {
		if !r.strict() {
			// The kernel in flight is abandoned with its VM or policy.
			r.sch.runner.backlog = math.Max(0, r.sch.runner.backlog)
		}
		r.finishRun(false)
	}
	r.sch.runner = nil
	r.sch.phase = phaseNone
}

func (r *GPURun) runTS(to int64) {
	capNs := float64(r.e.cal.BacklogCap)
	for guard := 0; r.t < to; guard++ {
		if r.sch.phase == phaseNone {
			r.schedule()
		}
		end := min(to, r.nextTrace(), r.nextBucket(), r.event())
		if end < r.t {
			end = r.t
		}
		dt := float64(end - r.t)
		s := &r.sch
		busy, watts, throttled := 0.0, r.pm.IdleW, false
		for _, x := range r.order {
			a := x.level * dt
			x.t.demand += a
			if s.phase == phaseRun && s.runner == x {
				if !r.strict() {
					x.backlog += a
					x.t.work += s.cf * dt
					x.t.run += dt
					x.bucketRun += dt
					busy = 1
				} else if x.backlog > 0 || x.level > s.cf {
					x.backlog += a - s.cf*dt
					if x.backlog < 0 {
						x.backlog = 0
					}
					x.t.work += s.cf * dt
					x.t.run += dt
					x.bucketRun += dt
					s.runAcc += dt
					busy = 1
				} else {
					// Trickle: served as it arrives.
					frac := x.level / s.cf
					x.t.work += a
					x.t.run += frac * dt
					x.bucketRun += frac * dt
					s.runAcc += frac * dt
					busy = frac
				}
				if busy > 0 {
					w := x.w.Power
					if w == 0 {
						w = 1
					}
					watts = tsRunPower(r.pm, r.e.cal, w, busy, s.cf)
					if s.cf < 1 {
						throttled = true
						x.t.throttle[reasonPowerCap] += busy * dt
					}
				}
			} else {
				x.backlog += a
			}
			if x.backlog > capNs {
				x.t.dropped += x.backlog - capNs
				x.backlog = capNs
			}
		}
		if s.phase == phaseSwitch {
			busy = 0
			watts = r.pm.IdleW
		}
		r.cf = 1
		if s.phase == phaseRun {
			r.cf = s.cf
		}
		r.account(dt, busy, watts, throttled)
		if s.phase == phaseSwitch {
			// A switch is not idle time: undo the idle reason account set.
			r.reasons &^= nvml.ClocksEventReasonGpuIdle
			r.throttle[reasonIdle] -= dt
		}
		r.t = end
		if r.traceStep() && s.phase == phaseIdle {
			// New demand: the idle GPU's wake-up time is stale.
			s.phase = phaseNone
		}
		r.flushBuckets()
		if r.t == r.event() {
			r.fire()
		} else if end == to {
			break
		}
		if guard > 1<<24 {
			// A model bug must not hang a test or the daemon.
			r.t = to
		}
	}
}
