package share

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// Loop polls every GPU, closes a window every Config.Window, and sets
// scheduler policies. Run drives it on a ticker; tests call Step with a
// simulated clock instead.
type Loop struct {
	cfg Config
	src Source
	drv Driver
	log *slog.Logger

	mu          sync.Mutex
	pollers     map[string]*gpuPoller
	inv         Inventory
	byUUID      map[string]Instance
	haveInv     bool
	windowStart time.Time
	windows     uint64
	invErrors   uint64

	snap atomic.Pointer[Snapshot]
	kick chan struct{}
	// kicked: a VM event came since the last step.
	kicked atomic.Bool
}

// New returns a loop over src and drv.
func New(src Source, drv Driver, cfg Config) (*Loop, error) {
	if src == nil || drv == nil {
		return nil, fmt.Errorf("%w: a source and a driver are required", ErrBadConfig)
	}
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	l := &Loop{cfg: cfg, src: src, drv: drv, log: cfg.Logger, pollers: map[string]*gpuPoller{}, byUUID: map[string]Instance{},
		kick: make(chan struct{}, 1)}
	l.snap.Store(&Snapshot{Mode: cfg.Mode, Window: cfg.Window})
	return l, nil
}

// Config returns the loop's configuration with defaults applied.
func (l *Loop) Config() Config { return l.cfg }

// Run steps the loop until ctx ends: every Poll while a GPU needs its
// scheduler log read (a time-sliced GPU running vGPUs, a pending policy
// switch), else once a window, at its end. A MIG-only or idle host is
// then woken once a second, not five times.
func (l *Loop) Run(ctx context.Context) error {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-l.kick:
		}
		if err := l.Step(ctx); err != nil && ctx.Err() == nil {
			l.log.Warn("share loop step", "err", err)
		}
		t.Stop()
		t.Reset(l.nextStep())
	}
}

// nextStep is how long Run sleeps after a step.
func (l *Loop) nextStep() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.pollers {
		if p.needsPolls() {
			return l.cfg.Poll
		}
	}
	return max(l.windowStart.Add(l.cfg.Window).Sub(l.cfg.Now()), 0)
}

// Kick makes a running loop step now (a VM started or stopped: a pending
// policy switch may go through, and an idle GPU is polled at every poll
// again until the next window says whether it runs vGPUs, so that its
// scheduler log is read before its ring wraps).
func (l *Loop) Kick() {
	l.kicked.Store(true)
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Snapshot returns the latest window. It never calls the driver.
func (l *Loop) Snapshot() *Snapshot { return l.snap.Load() }

// Shares returns every instance's latest window.
func (l *Loop) Shares() []Share {
	s := l.Snapshot()
	out := make([]Share, 0, len(s.Instances))
	for _, i := range s.Instances {
		out = append(out, Share{Instance: i.UUID, Tenant: i.Tenant, GPU: i.GPU, Active: i.Active, Entitled: i.Entitled,
			Achieved: i.Achieved, Demand: i.Demand, Interference: i.Interference, Window: s.Time})
	}
	return out
}

func (l *Loop) instance(uuid string) Instance { return l.byUUID[uuid] }

func (l *Loop) refresh(ctx context.Context) error {
	inv, err := l.src.Inventory(ctx)
	if err != nil {
		l.invErrors++
		return fmt.Errorf("share loop inventory: %w", err)
	}
	l.inv, l.haveInv = inv, true
	l.byUUID = make(map[string]Instance, len(inv.Instances))
	for _, i := range inv.Instances {
		l.byUUID[i.UUID] = i
	}
	seen := map[string]bool{}
	for _, g := range inv.GPUs {
		seen[g.UUID] = true
		p := l.pollers[g.UUID]
		switch {
		case p == nil:
			l.pollers[g.UUID] = newPoller(l, g)
		case p.info.MIG != g.MIG:
			// The GPU's mode changed: its scheduler must be read again.
			p.info, p.capsRead, p.stateRead, p.logSeen = g, false, false, false
		default:
			p.info = g
		}
	}
	for id := range l.pollers {
		if !seen[id] {
			delete(l.pollers, id)
		}
	}
	return nil
}

// polled reports whether a GPU is read at all (a lost GPU answers nothing).
func polled(g GPU) bool { return g.State != gpu.StateLost && g.State != gpu.StatePassthrough }

// Step is one poll of every GPU, and the end of a window when one is due.
func (l *Loop) Step(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.cfg.Now()
	if !l.haveInv {
		if err := l.refresh(ctx); err != nil {
			return err
		}
		l.windowStart = now
	}
	if l.kicked.Swap(false) {
		for _, p := range l.pollers {
			p.awake = true
		}
	}
	closing := now.Sub(l.windowStart) >= l.cfg.Window-l.cfg.Poll/2
	// Busy time-sliced GPUs are read every poll (the scheduler log ring
	// needs it); MIG GPUs, whose clocks are all there is to poll, and idle
	// GPUs once a window.
	l.eachWhere(func(p *gpuPoller) bool { return closing || p.needsPolls() },
		func(p *gpuPoller) { p.poll(ctx, now) })
	if !closing {
		return nil
	}
	window := now.Sub(l.windowStart)
	l.windowStart = now
	byGPU := map[string][]Instance{}
	for _, i := range l.inv.Instances {
		byGPU[i.GPU] = append(byGPU[i.GPU], i)
	}
	var mu sync.Mutex
	var shares []InstanceShare
	views := map[string]GPUShares{}
	l.each(func(p *gpuPoller) {
		s := p.closeWindow(ctx, now, window, byGPU[p.uuid])
		p.decide(ctx, now, window, byGPU[p.uuid], s)
		p.decideGIs(ctx, now, window, byGPU[p.uuid], s)
		v := p.view(s)
		mu.Lock()
		shares = append(shares, s...)
		views[p.uuid] = v
		mu.Unlock()
	})
	// Instances on GPUs that are not read (lost) are reported inactive.
	for _, g := range l.inv.GPUs {
		if _, ok := views[g.UUID]; ok {
			continue
		}
		for _, i := range byGPU[g.UUID] {
			shares = append(shares, InstanceShare{UUID: i.UUID, Tenant: i.Tenant, GPU: i.GPU, Kind: i.Kind, Entitled: i.Entitled()})
		}
	}
	sort.Slice(shares, func(a, b int) bool { return shares[a].UUID < shares[b].UUID })
	l.windows++
	snap := &Snapshot{Time: now, Window: window, Mode: l.cfg.Mode, Inventory: l.inv, Instances: shares,
		Tenants: tenantShares(l.inv.Tenants, shares), Windows: l.windows, PollErrors: l.invErrors}
	for _, g := range l.inv.GPUs {
		if v, ok := views[g.UUID]; ok {
			snap.GPUs = append(snap.GPUs, v)
			snap.PollErrors += l.pollers[g.UUID].errs
		} else {
			snap.GPUs = append(snap.GPUs, GPUShares{UUID: g.UUID, Policy: Unknown, Desired: Unknown})
		}
	}
	l.snap.Store(snap)
	if err := l.refresh(ctx); err != nil {
		return err
	}
	return nil
}

// each runs fn for every polled GPU, the GPUs in parallel (a slow driver
// on one GPU does not hold the others up).
func (l *Loop) each(fn func(p *gpuPoller)) {
	l.eachWhere(func(*gpuPoller) bool { return true }, fn)
}

func (l *Loop) eachWhere(want func(p *gpuPoller) bool, fn func(p *gpuPoller)) {
	var wg sync.WaitGroup
	for _, g := range l.inv.GPUs {
		p := l.pollers[g.UUID]
		if p == nil || !polled(g) || !want(p) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(p)
		}()
	}
	wg.Wait()
}
