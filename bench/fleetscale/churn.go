package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/pkg/fleet"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// Churn is the fleet under steady scheduling: schedulers as Nova's work
// (candidates, claim, create, the next on refusal) and destroys of what
// they made, while a prober times the sync lag.
type Churn struct {
	Schedulers   int     `json:"schedulers"`
	Ops          int     `json:"ops"`
	WallS        float64 `json:"wallS"`
	Placed       int64   `json:"placed"`
	StaleRefused int64   `json:"staleRefused"`
	ClaimsLost   int64   `json:"claimsLostInPlacement"`
	NoCandidate  int64   `json:"noCandidate"`
	Destroyed    int64   `json:"destroyed"`
	// StaleFraction is the claims Placement accepted that a host then
	// refused, over all it accepted.
	StaleFraction float64 `json:"staleFraction"`
	// HostRequestsPerSec are the hosts' syncers' requests (claims, settles,
	// passes), SchedulerRequestsPerSec the schedulers' (candidates,
	// claims), both over the churn's wall time.
	HostRequestsPerSec      float64 `json:"hostRequestsPerSec"`
	SchedulerRequestsPerSec float64 `json:"schedulerRequestsPerSec"`
	// HostRequestsPerHostOp: the hosts' requests per create, refusal and
	// destroy.
	HostRequestsPerHostOp float64 `json:"hostRequestsPerHostOp"`
	// Sync lag: a destroy's return until Placement no longer holds the
	// allocation, polled every 2 ms, sampled while the churn runs.
	LagSamples int     `json:"syncLagSamples"`
	LagP50Ms   float64 `json:"syncLagP50Ms"`
	LagP99Ms   float64 `json:"syncLagP99Ms"`
	LagMaxMs   float64 `json:"syncLagMaxMs"`
	// SettlesDone and SettlesLeft: the hosts' settles during the churn
	// that brought Placement up to date before their operation returned,
	// and those that left it to the next pass (their deadline ran out, or
	// Placement refused).
	SettlesDone float64 `json:"settlesDone"`
	SettlesLeft float64 `json:"settlesLeft"`
	// OverCommit counts instances a host holds whose allocation Placement
	// does not hold on its providers, once the churn settled: capacity a
	// scheduler could give again. PlacementOnly counts the reverse,
	// allocations without an instance (a scheduler's claim it gave up
	// on): capacity held idle until the host's grace removes it.
	OverCommit    int      `json:"overCommit"`
	PlacementOnly int      `json:"placementOnly"`
	Differences   []string `json:"differences,omitempty"`
	// PeriodicPassRequests is one host's requests for a pass with nothing
	// to change; IdleRequestsPerSec what the whole fleet's periodic passes
	// cost Placement at the sync interval.
	PeriodicPassRequests float64 `json:"periodicPassRequests"`
	IdleRequestsPerSec   float64 `json:"idleRequestsPerSec"`
}

// hostSettles sums the hosts' settles by outcome.
func hostSettles(hosts []*host) (done, left float64, err error) {
	for _, h := range hosts {
		d, f, err := h.settles()
		if err != nil {
			return 0, 0, err
		}
		done, left = done+d, left+f
	}
	return done, left, nil
}

func hostRequests(hosts []*host) uint64 {
	var n uint64
	for _, h := range hosts {
		n += h.c.Requests()
	}
	return n
}

func runChurn(ctx context.Context, c *placementapi.Client, hosts []*host, workers, ops int, interval time.Duration) (Churn, error) {
	var sh []tplacement.Host
	for _, h := range hosts {
		sh = append(sh, h)
	}
	reqs := tplacement.Requests(fleet.ClassName, tplacement.WithFramebuffer, tplacement.ChurnProfiles...)
	sched := &tplacement.Scheduler{C: c, Hosts: sh}
	h0, c0 := hostRequests(hosts), c.Requests()
	d0, l0, err := hostSettles(hosts)
	if err != nil {
		return Churn{}, err
	}
	start := time.Now()
	stop := make(chan struct{})
	var lags []float64
	var probeOps atomic.Int64
	var probeErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		lags, probeErr = probe(ctx, c, sh, reqs, stop, &probeOps)
	}()
	err = sched.Churn(ctx, workers, ops, reqs, 1)
	close(stop)
	wg.Wait()
	wall := time.Since(start)
	if err != nil {
		return Churn{}, fmt.Errorf("churn: %w", err)
	}
	if probeErr != nil {
		return Churn{}, fmt.Errorf("lag probe: %w", probeErr)
	}
	h1, c1 := hostRequests(hosts), c.Requests()
	r := Churn{Schedulers: workers, Ops: ops, WallS: wall.Seconds(), Placed: sched.Placed.Load(), StaleRefused: sched.Stale.Load(),
		ClaimsLost: sched.ClaimLost.Load(), NoCandidate: sched.NoCandidate.Load(), Destroyed: sched.Destroyed.Load(),
		LagSamples: len(lags), LagP50Ms: quantile(lags, 0.5), LagP99Ms: quantile(lags, 0.99), LagMaxMs: quantile(lags, 1)}
	d1, l1, err := hostSettles(hosts)
	if err != nil {
		return Churn{}, err
	}
	r.SettlesDone, r.SettlesLeft = d1-d0, l1-l0
	if n := r.Placed + r.StaleRefused; n > 0 {
		r.StaleFraction = float64(r.StaleRefused) / float64(n)
	}
	r.HostRequestsPerSec = float64(h1-h0) / wall.Seconds()
	r.SchedulerRequestsPerSec = float64(c1-c0) / wall.Seconds()
	if n := r.Placed + r.StaleRefused + r.Destroyed + probeOps.Load(); n > 0 {
		r.HostRequestsPerHostOp = float64(h1-h0) / float64(n)
	}
	if r.OverCommit, r.PlacementOnly, r.Differences, err = settle(ctx, c, hosts); err != nil {
		return Churn{}, err
	}
	// One pass with nothing to change, on the first host.
	b := hosts[0].c.Requests()
	if err := hosts[0].s.Pass(ctx); err != nil {
		return Churn{}, err
	}
	r.PeriodicPassRequests = float64(hosts[0].c.Requests() - b)
	r.IdleRequestsPerSec = r.PeriodicPassRequests * float64(len(hosts)) / interval.Seconds()
	return r, nil
}

// probe places one instance at a time, destroys it and times until
// Placement lets its allocation go, until stop closes.
func probe(ctx context.Context, c *placementapi.Client, hosts []tplacement.Host, reqs []tplacement.Request, stop <-chan struct{}, ops *atomic.Int64) ([]float64, error) {
	sched := &tplacement.Scheduler{C: c, Hosts: hosts}
	rnd := rand.New(rand.NewPCG(7, 7))
	var out []float64
	for {
		select {
		case <-stop:
			return out, nil
		case <-time.After(50 * time.Millisecond):
		}
		id, h, err := sched.Place(ctx, reqs[rnd.IntN(len(reqs))], rnd)
		if errors.Is(err, tplacement.ErrFull) {
			continue
		}
		if err != nil {
			return nil, err
		}
		ops.Add(2)
		if err := h.Destroy(ctx, id); err != nil {
			return nil, fmt.Errorf("destroy %s on %s: %w", id, h.Name(), err)
		}
		start := time.Now()
		for {
			cons, err := c.Consumer(ctx, id)
			if err != nil {
				return nil, err
			}
			if len(cons.Allocations) == 0 {
				break
			}
			if time.Since(start) > 2*time.Minute {
				return nil, fmt.Errorf("allocation of %s still there after 2 min", id)
			}
			time.Sleep(2 * time.Millisecond)
		}
		out = append(out, ms(time.Since(start)))
	}
}

// settle runs a pass on every host (their last events taken in) and
// compares Placement with the hosts, a few rounds until they agree. It
// returns the instances Placement does not hold, the allocations the
// hosts do not hold, and the first few of them named.
func settle(ctx context.Context, c *placementapi.Client, hosts []*host) (int, int, []string, error) {
	var hostOnly, placementOnly []string
	for round := 0; round < 5; round++ {
		if err := each(len(hosts), 8, func(i int) error { return hosts[i].s.Pass(ctx) }); err != nil {
			return 0, 0, nil, fmt.Errorf("settle pass: %w", err)
		}
		var mu sync.Mutex
		hostOnly, placementOnly = nil, nil
		if err := each(len(hosts), 8, func(i int) error {
			ho, po, err := differences(ctx, c, hosts[i])
			mu.Lock()
			hostOnly, placementOnly = append(hostOnly, ho...), append(placementOnly, po...)
			mu.Unlock()
			return err
		}); err != nil {
			return 0, 0, nil, err
		}
		if len(hostOnly)+len(placementOnly) == 0 {
			return 0, 0, nil, nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	var named []string
	for _, d := range hostOnly {
		named = append(named, "instance without allocation: "+d)
	}
	for _, d := range placementOnly {
		named = append(named, "allocation without instance: "+d)
	}
	return len(hostOnly), len(placementOnly), named[:min(len(named), 10)], nil
}

// differences names the instances h holds whose allocation Placement
// does not hold on h's providers, and the allocations there without an
// instance.
func differences(ctx context.Context, c *placementapi.Client, h *host) (hostOnly, placementOnly []string, err error) {
	view, err := h.h.Manager.FleetView()
	if err != nil {
		return nil, nil, err
	}
	for _, g := range view {
		have, err := c.ProviderAllocations(ctx, h.gpus[g.PCI])
		if err != nil {
			return nil, nil, fmt.Errorf("%s %s: %w", h.name, g.PCI, err)
		}
		want := map[string]bool{}
		for _, r := range g.Records {
			id := r.Record.UUID
			want[id] = true
			if _, ok := have[id]; !ok {
				hostOnly = append(hostOnly, h.name+" "+g.PCI+" "+id)
			}
		}
		for consumer := range have {
			if !want[consumer] {
				placementOnly = append(placementOnly, h.name+" "+g.PCI+" "+consumer)
			}
		}
	}
	return hostOnly, placementOnly, nil
}
