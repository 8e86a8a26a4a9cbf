package share

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// Policy control. The driver takes a scheduler change only while no VM
// with a vGPU runs on the GPU (nvml.h: NOT_SUPPORTED "if any vGPU instance
// currently exists on the device"). The loop therefore decides, tries,
// reports a refusal as such (metric, log, event), keeps the switch
// pending and applies it at the first poll that finds the GPU's VMs
// stopped, or on a retry every RetryEvery.

// decide picks the GPU's wanted policy at the end of a window. It runs
// for time-sliced GPUs whose scheduler is supported.
func (p *gpuPoller) decide(ctx context.Context, now time.Time, window time.Duration, insts []Instance, shares []InstanceShare) {
	cfg := &p.l.cfg
	if p.info.Pinned {
		// An operator pinned the GPU's scheduler: the loop leaves it alone,
		// and a switch it had waiting is given up.
		if p.pending != nil {
			p.emit(now, "cancelled", p.state.Policy, p.pending.To, "the GPU's scheduler was pinned by an operator")
			p.pending = nil
		}
		return
	}
	if cfg.Mode == Observe || !p.supported || !p.stateRead || !p.timeSliced() {
		return
	}
	var target Policy
	reason := ""
	switch cfg.Mode {
	case Static:
		target = cfg.SharedPolicy
		for _, i := range insts {
			if i.Guaranteed && i.Kind == TimeSliced {
				target, reason = FixedShare, fmt.Sprintf("tenant %s is guaranteed (instance %s)", i.Tenant, i.UUID)
				break
			}
		}
		if reason == "" {
			reason = "no guaranteed tenant on the GPU"
		}
	case Adaptive:
		target, reason = p.adapt(window, shares)
	}
	p.want(ctx, now, target, reason)
}

// adapt is the adaptive mode's state machine: from the shared policy to
// FIXED_SHARE when a guaranteed instance stays starved for Hold, back when
// the GPU stays without contention for ReleaseHold.
func (p *gpuPoller) adapt(window time.Duration, shares []InstanceShare) (Policy, string) {
	a := adaptState{desired: p.desired, starved: p.starved, calm: p.calm}
	to, why := a.next(&p.l.cfg, p.state.Policy, window, shares, 1)
	p.desired, p.starved, p.calm = a.desired, a.starved, a.calm
	return to, why
}

// adaptState is what the adaptive mode remembers of one scheduler (a
// GPU's, or a GPU instance's) between windows.
type adaptState struct {
	desired       Policy
	starved, calm time.Duration
}

// next is the adaptive mode's state machine over one scheduler's
// instances: cur is the driver's policy now, capacity the share of the
// GPU the scheduler divides (1 for the GPU's, a GPU instance's slices
// over the grid for its own), against which their demand is contention.
func (a *adaptState) next(cfg *Config, cur Policy, window time.Duration, shares []InstanceShare, capacity float64) (Policy, string) {
	if a.desired != FixedShare && a.desired != cfg.SharedPolicy {
		// First decision: keep a fixed share someone set; else start shared.
		a.desired = cfg.SharedPolicy
		if cur == FixedShare {
			a.desired = FixedShare
		}
	}
	var worst *InstanceShare
	saturated, demand, calm := 0, 0.0, true
	for k := range shares {
		s := &shares[k]
		if !s.Active {
			continue
		}
		if s.Saturated {
			saturated++
		}
		demand += s.Demand
		if s.Entitled > 0 {
			if worst == nil || s.Interference > worst.Interference {
				worst = s
			}
			if s.Interference > cfg.Release {
				calm = false
			}
		}
	}
	contention := saturated >= 2 || demand > capacity
	if a.desired == FixedShare {
		if calm && !contention {
			a.calm += window
		} else {
			a.calm = 0
		}
		if a.calm >= cfg.ReleaseHold {
			a.calm, a.starved = 0, 0
			return cfg.SharedPolicy, fmt.Sprintf("no contention for %v (hysteresis)", cfg.ReleaseHold)
		}
		return FixedShare, "keeping fixed share while there is contention"
	}
	if worst != nil && worst.Interference > cfg.Threshold {
		a.starved += window
	} else {
		a.starved = 0
	}
	if a.starved >= cfg.Hold && worst != nil {
		a.starved, a.calm = 0, 0
		return FixedShare, fmt.Sprintf("guaranteed instance %s of tenant %s starved: interference %.2f > %.2f for %v",
			worst.UUID, worst.Tenant, worst.Interference, cfg.Threshold, cfg.Hold)
	}
	return cfg.SharedPolicy, "work-conserving while no guaranteed instance is starved"
}

// stateFor is the full scheduler state the loop sets for policy.
func (p *gpuPoller) stateFor(policy Policy) State {
	cfg := &p.l.cfg
	s := State{Policy: policy}
	if cfg.ARRFrequency > 0 && p.caps.ARR {
		s.ARR = true
		s.Frequency = clampU(cfg.ARRFrequency, p.caps.MinFrequency, p.caps.MaxFrequency)
		s.AvgFactor = max(p.caps.MinAvgFactor, 1)
		return s
	}
	if cfg.Timeslice > 0 {
		s.Timeslice = cfg.Timeslice
		if p.caps.MinTimeslice > 0 && s.Timeslice < p.caps.MinTimeslice {
			s.Timeslice = p.caps.MinTimeslice
		}
		if p.caps.MaxTimeslice > 0 && s.Timeslice > p.caps.MaxTimeslice {
			s.Timeslice = p.caps.MaxTimeslice
		}
		// The driver takes a slice as a frequency in whole Hz
		// (nvmlDeviceSetVgpuSchedulerState_v2) and reports 1 s / that
		// frequency: want what it will report, or the loop would never
		// see its state reached; and the nearest such slice inside the
		// range (30 ms is 33.3 Hz, and 33 Hz, 30.3 ms, is refused).
		s.Timeslice = gpu.SliceWithin(s.Timeslice, p.caps.MinTimeslice, p.caps.MaxTimeslice)
	}
	return s
}

func clampU(v, lo, hi uint32) uint32 {
	if hi > 0 && v > hi {
		v = hi
	}
	if v < lo {
		v = lo
	}
	return v
}

// matches: the driver's state already is what the loop would set.
func (p *gpuPoller) matches(want State) bool {
	cur := p.state
	if cur.Policy != want.Policy || cur.ARR != want.ARR {
		return false
	}
	if want.ARR {
		return cur.Frequency == 0 || cur.Frequency == want.Frequency
	}
	return want.Timeslice == 0 || cur.Timeslice == want.Timeslice
}

// want records the target and tries to reach it.
func (p *gpuPoller) want(ctx context.Context, now time.Time, target Policy, reason string) {
	p.desired = target
	st := p.stateFor(target)
	if p.matches(st) {
		if p.pending != nil {
			p.emit(now, "cancelled", p.state.Policy, p.pending.To, "the driver's policy is already wanted: "+reason)
			p.pending = nil
		}
		return
	}
	if !p.caps.supports(target) {
		p.count(target, "unsupported_policy")
		if !p.unsupportedLogged[target] {
			p.unsupportedLogged[target] = true
			p.l.log.Warn("vGPU scheduler policy wanted but not offered by the GPU: not set (counted as refused, reason unsupported_policy)",
				"gpu", p.uuid, "policy", target, "offered", p.caps.Policies, "reason", reason)
		}
		return
	}
	if p.pending != nil && p.pending.To == target {
		return // poll retries it
	}
	if p.pending != nil {
		p.emit(now, "cancelled", p.state.Policy, p.pending.To, "superseded by "+string(target))
	}
	p.pending = &Pending{To: target, Since: now, Reason: reason}
	p.attempt(ctx, now)
}

// retry tries a pending switch again when the GPU's last VM has stopped,
// or every RetryEvery.
func (p *gpuPoller) retry(ctx context.Context, now time.Time) {
	if now.Sub(p.lastTry) < p.l.cfg.RetryEvery {
		n, err := p.drv.ActiveVGPUCount(ctx)
		if err != nil || n > 0 {
			return
		}
	}
	p.attempt(ctx, now)
}

func (p *gpuPoller) count(to Policy, why string) {
	m := p.refusals[to]
	if m == nil {
		m = map[string]uint64{}
		p.refusals[to] = m
	}
	m[why]++
}

func (p *gpuPoller) attempt(ctx context.Context, now time.Time) {
	pd := p.pending
	p.lastTry = now
	pd.Attempts++
	from := p.state.Policy
	st := p.stateFor(pd.To)
	set := func() error { return p.drv.SetSchedulerState(ctx, st) }
	ran, err := true, error(nil)
	if g := p.l.cfg.Guard; g != nil {
		ran, err = g(ctx, p.uuid, set)
	} else {
		err = set()
	}
	log := p.l.log.With("gpu", p.uuid, "from", from, "to", pd.To)
	switch {
	case !ran && err == nil:
		// An operator pinned the GPU since the loop's inventory was read:
		// the pin stands, and the loop leaves the GPU alone until its
		// inventory says otherwise.
		p.info.Pinned = true
		p.pending = nil
		log.Info("vGPU scheduler policy switch given up: the GPU's scheduler was pinned by an operator", "reason", pd.Reason)
		p.emit(now, "cancelled", from, pd.To, "the GPU's scheduler was pinned by an operator")
		if s, err := p.drv.SchedulerState(ctx); err == nil {
			p.state = s
		}
	case err == nil:
		p.switches[[2]Policy{from, pd.To}]++
		waited := now.Sub(pd.Since)
		log.Info("vGPU scheduler policy switched", "reason", pd.Reason, "attempts", pd.Attempts, "waited", waited)
		p.emit(now, "switched", from, pd.To, fmt.Sprintf("%s (after %d attempts, %v pending)", pd.Reason, pd.Attempts, waited.Round(time.Millisecond)))
		p.pending = nil
		p.state = st
		if s, err := p.drv.SchedulerState(ctx); err == nil {
			p.state = s
		}
	case errors.Is(err, gpu.ErrNotSupported):
		p.count(pd.To, "not_supported")
		if pd.Attempts == 1 {
			why := fmt.Sprintf("the driver refused it (NOT_SUPPORTED: it takes a scheduler change only while no VM with a vGPU runs on the GPU); pending until the GPU's VMs stop: %s", pd.Reason)
			log.Warn("vGPU scheduler policy switch pending", "reason", pd.Reason, "err", err)
			p.emit(now, "pending", from, pd.To, why)
		} else {
			log.Debug("vGPU scheduler policy switch still refused", "attempts", pd.Attempts, "err", err)
		}
	default:
		p.count(pd.To, "error")
		log.Error("vGPU scheduler policy switch failed", "reason", pd.Reason, "attempts", pd.Attempts, "err", err)
		if pd.Attempts == 1 {
			p.emit(now, "refused", from, pd.To, fmt.Sprintf("%v; retried every %v", err, p.l.cfg.RetryEvery))
		}
	}
}

func (p *gpuPoller) emit(now time.Time, kind string, from, to Policy, reason string) {
	if f := p.l.cfg.OnEvent; f != nil {
		f(Event{GPU: p.uuid, Kind: kind, From: from, To: to, Reason: reason, Time: now})
	}
}
