package share

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// The schedulers of GPU instances (Blackwell GB20x in MIG mode: the vGPUs
// of one GPU instance take turns under a scheduler of that GPU instance,
// nvmlGpuInstance{Get,Set}VgpuSchedulerState_v2). Where the driver has
// them, the loop drives each one that no operator pinned as it drives a
// time-sliced GPU's: the static mode gives a GPU instance holding a
// guaranteed tenant's vGPU FIXED_SHARE and the shared policy otherwise;
// the adaptive mode runs the same state machine over the vGPUs of the
// GPU instance, with the GPU instance's slices as the capacity their
// demand is measured against. The driver takes a change only while no VM
// runs in the GPU instance (NOT_SUPPORTED): the switch is pending and
// tried again at each window's end. A GPU instance whose read is
// NOT_SUPPORTED (no such scheduler on this GPU or driver) is left alone,
// said once. The GPU instance calls have no capabilities query: every
// policy is taken as offered and a time slice is kept inside the
// documented range.
//
// The operator's pin is read from the inventory (GPUInstanceScheduler
// Pinned); one set between two inventory reads is set again by the
// manager's pass, which compares the driver's setting with the pin.

// GPUInstanceSchedulerDriver is what a GPUDriver offers where the GPU's
// GPU instances have schedulers of their own; the loop drives them only
// through a GPUDriver that implements it. Errors as GPUDriver's:
// gpu.ErrNotSupported for a GPU or GPU instance without one, and for a
// set while a VM runs in the GPU instance.
type GPUInstanceSchedulerDriver interface {
	GPUInstanceSchedulerState(ctx context.Context, gi int) (State, error)
	SetGPUInstanceSchedulerState(ctx context.Context, gi int, s State) error
}

// giPoller is the loop's memory of one GPU instance's scheduler.
type giPoller struct {
	gi          int
	unsupported bool
	state       State
	stateRead   bool
	adapt       adaptState
	pending     *Pending
	switches    uint64
	refusals    uint64
}

// GPUInstanceShares is one GPU instance's scheduler in a snapshot.
type GPUInstanceShares struct {
	GI int
	// Supported: the driver answered a read of its scheduler.
	Supported bool
	// Pinned: an operator pinned it; the loop leaves it alone.
	Pinned bool
	// Policy is the driver's now (Unknown before a read), Desired the
	// loop's target.
	Policy, Desired Policy
	Pending         *Pending
	// Switches counts the changes the driver took, Refusals the attempts
	// it refused.
	Switches, Refusals uint64
}

// decideGIs decides and sets the schedulers of the GPU's GPU instances at
// the end of a window (shares are the window's, insts the GPU's).
func (p *gpuPoller) decideGIs(ctx context.Context, now time.Time, window time.Duration, insts []Instance, shares []InstanceShare) {
	cfg := &p.l.cfg
	gd, ok := p.drv.(GPUInstanceSchedulerDriver)
	if !ok || !p.info.MIG || len(p.info.GPUInstanceSchedulers) == 0 {
		p.gis = nil
		return
	}
	if p.gis == nil {
		p.gis = map[int]*giPoller{}
	}
	byUUID := make(map[string]InstanceShare, len(shares))
	for _, s := range shares {
		byUUID[s.UUID] = s
	}
	seen := map[int]bool{}
	for _, s := range p.info.GPUInstanceSchedulers {
		seen[s.GI] = true
		x := p.gis[s.GI]
		if x == nil {
			x = &giPoller{gi: s.GI, adapt: adaptState{desired: Unknown}}
			p.gis[s.GI] = x
		}
		if s.Pinned {
			if x.pending != nil {
				p.emitGI(now, s.GI, "cancelled", x.state.Policy, x.pending.To, "the GPU instance's scheduler was pinned by an operator")
				x.pending = nil
			}
			continue
		}
		if cfg.Mode == Observe || x.unsupported {
			continue
		}
		st, err := gd.GPUInstanceSchedulerState(ctx, s.GI)
		switch {
		case errors.Is(err, gpu.ErrNotSupported):
			x.unsupported = true
			p.l.log.Info("GPU instance vGPU scheduler not supported: its policy is not set", "gpu", p.uuid, "gpuInstance", s.GI, "err", err)
			continue
		case err != nil:
			p.fail(now, "GPU instance scheduler state", err)
			continue
		}
		x.state, x.stateRead = st, true
		var own []Instance
		var ownShares []InstanceShare
		capacity := 0.0
		for _, i := range insts {
			if i.GI != s.GI {
				continue
			}
			own = append(own, i)
			if sh, ok := byUUID[i.UUID]; ok {
				ownShares = append(ownShares, sh)
			}
			if i.GISize > 0 && p.info.MIGSlots > 0 {
				capacity = float64(i.GISize) / float64(p.info.MIGSlots)
			}
		}
		var target Policy
		var reason string
		switch cfg.Mode {
		case Static:
			target, reason = cfg.SharedPolicy, "no guaranteed tenant in the GPU instance"
			for _, i := range own {
				if i.Guaranteed {
					target, reason = FixedShare, fmt.Sprintf("tenant %s is guaranteed (instance %s)", i.Tenant, i.UUID)
					break
				}
			}
		case Adaptive:
			if capacity == 0 {
				capacity = 1
			}
			target, reason = x.adapt.next(cfg, st.Policy, window, ownShares, capacity)
		}
		p.wantGI(ctx, now, gd, x, target, reason)
	}
	for gi := range p.gis {
		if !seen[gi] {
			delete(p.gis, gi) // gone, or no longer hosts vGPUs
		}
	}
}

// giStateFor is the state the loop sets on a GPU instance for policy: the
// configured time slice inside the documented range (no ARR: the GPU
// instance calls report no capabilities to take it from).
func (p *gpuPoller) giStateFor(policy Policy) State {
	s := State{Policy: policy}
	if ts := p.l.cfg.Timeslice; ts > 0 {
		s.Timeslice = gpu.SettableTimeslice(ts)
	}
	return s
}

// wantGI records the target of GPU instance x and tries to reach it.
func (p *gpuPoller) wantGI(ctx context.Context, now time.Time, gd GPUInstanceSchedulerDriver, x *giPoller, target Policy, reason string) {
	x.adapt.desired = target
	st := p.giStateFor(target)
	if x.state.Policy == st.Policy && !x.state.ARR && (st.Timeslice == 0 || x.state.Timeslice == st.Timeslice) {
		if x.pending != nil {
			p.emitGI(now, x.gi, "cancelled", x.state.Policy, x.pending.To, "the driver's policy is already wanted: "+reason)
			x.pending = nil
		}
		return
	}
	if x.pending != nil && x.pending.To != target {
		p.emitGI(now, x.gi, "cancelled", x.state.Policy, x.pending.To, "superseded by "+string(target))
		x.pending = nil
	}
	if x.pending == nil {
		x.pending = &Pending{To: target, Since: now, Reason: reason}
	}
	pd := x.pending
	pd.Attempts++
	from := x.state.Policy
	log := p.l.log.With("gpu", p.uuid, "gpuInstance", x.gi, "from", from, "to", target)
	err := gd.SetGPUInstanceSchedulerState(ctx, x.gi, st)
	switch {
	case err == nil:
		x.switches++
		log.Info("GPU instance vGPU scheduler policy switched", "reason", reason, "attempts", pd.Attempts)
		p.emitGI(now, x.gi, "switched", from, target, fmt.Sprintf("%s (after %d attempts, %v pending)", reason, pd.Attempts, now.Sub(pd.Since).Round(time.Millisecond)))
		x.pending, x.state = nil, st
		if s, err := gd.GPUInstanceSchedulerState(ctx, x.gi); err == nil {
			x.state = s
		}
	case errors.Is(err, gpu.ErrNotSupported):
		x.refusals++
		if pd.Attempts == 1 {
			log.Warn("GPU instance vGPU scheduler policy switch pending", "reason", reason, "err", err)
			p.emitGI(now, x.gi, "pending", from, target, "the driver refused it (NOT_SUPPORTED: it takes a change only while no VM runs in the GPU instance); pending until it stops: "+reason)
		}
	default:
		x.refusals++
		if pd.Attempts == 1 {
			log.Error("GPU instance vGPU scheduler policy switch failed", "reason", reason, "err", err)
			p.emitGI(now, x.gi, "refused", from, target, fmt.Sprintf("%v; retried at each window's end", err))
		}
	}
}

func (p *gpuPoller) emitGI(now time.Time, gi int, kind string, from, to Policy, reason string) {
	if f := p.l.cfg.OnEvent; f != nil {
		f(Event{GPU: p.uuid, GPUInstance: &gi, Kind: kind, From: from, To: to, Reason: reason, Time: now})
	}
}

// giViews is the snapshot of the GPU's GPU instance schedulers, in the
// inventory's order.
func (p *gpuPoller) giViews() []GPUInstanceShares {
	var out []GPUInstanceShares
	for _, s := range p.info.GPUInstanceSchedulers {
		v := GPUInstanceShares{GI: s.GI, Pinned: s.Pinned, Policy: Unknown, Desired: Unknown}
		if s.Pinned {
			v.Desired = s.Policy
			if s.Pending {
				v.Pending = &Pending{To: s.Policy, Reason: "pinned by an operator; set when the GPU instance's VM stops"}
			}
		}
		if x := p.gis[s.GI]; x != nil {
			v.Supported = x.stateRead && !x.unsupported
			if x.stateRead {
				v.Policy = x.state.Policy
			}
			if !s.Pinned {
				v.Desired = x.adapt.desired
				if x.pending != nil {
					c := *x.pending
					v.Pending = &c
				}
			}
			v.Switches, v.Refusals = x.switches, x.refusals
		}
		out = append(out, v)
	}
	return out
}
