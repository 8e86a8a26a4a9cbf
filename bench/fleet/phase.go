package main

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/pkg/fleet"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

func phase(ctx context.Context, c *placementapi.Client, hosts []*host, sh []tplacement.Host, workers, ops int, reqs []tplacement.Request, mode string) (Phase, error) {
	sched := &tplacement.Scheduler{C: c, Hosts: sh}
	var why causes
	sched.OnStale = why.add
	var rm rooms
	rctx, stopRooms := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		rm.run(rctx, hosts, reqs, mode, 250*time.Millisecond)
	}()
	var lost atomic.Int64
	sched.OnFull = func(r tplacement.Request) {
		for _, h := range hosts {
			if p, err := h.h.Manager.Plan(ctx, manager.CreateRequest{Tenant: "acme", Profile: r.Profile}); err == nil && p.Fits && p.QuotaOK {
				lost.Add(1)
				return
			}
		}
	}
	var req0 uint64
	for _, h := range hosts {
		req0 += h.c.Requests()
	}
	err := sched.Churn(ctx, workers, ops, reqs, uint64(workers))
	stopRooms()
	<-done
	if err != nil {
		return Phase{}, fmt.Errorf("%d schedulers: %w", workers, err)
	}
	var req1 uint64
	for _, h := range hosts {
		req1 += h.c.Requests()
	}
	p := Phase{Schedulers: workers, Placed: sched.Placed.Load(), StaleRefused: sched.Stale.Load(),
		ClaimsLost: sched.ClaimLost.Load(), NoCandidate: sched.NoCandidate.Load(), Destroyed: sched.Destroyed.Load(),
		LostAgainstLocal: lost.Load(), StaleByCause: why.counts(), StaleSamples: why.samples}
	if rm.samples > 0 {
		p.RoomsExact, p.RoomsOffered = float64(rm.exact)/float64(rm.samples), float64(rm.offered)/float64(rm.samples)
	}
	if rm.exact > 0 {
		p.RoomsNotOffered = 1 - float64(rm.offered)/float64(rm.exact)
	}
	if n := p.Placed + p.StaleRefused; n > 0 {
		p.StaleFraction = float64(p.StaleRefused) / float64(n)
	}
	if n := p.Placed + p.NoCandidate; n > 0 {
		p.Acceptance = float64(p.Placed) / float64(n)
	}
	if n := p.Placed + p.StaleRefused + p.Destroyed; n > 0 {
		p.RequestsPerHostOp = float64(req1-req0) / float64(n)
	}
	// Settle (the hosts' last events taken in: a few passes at most), then
	// compare.
	for round := 0; round < 10; round++ {
		for _, h := range hosts {
			if err := h.s.Pass(ctx); err != nil {
				return Phase{}, err
			}
		}
		if p.OverCommit, err = overCommit(ctx, c, hosts); err != nil {
			return Phase{}, err
		}
		if p.OverCommit == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	lags, err := lag(ctx, c, hosts, 20)
	if err != nil {
		return Phase{}, err
	}
	p.LagP50Ms, p.LagP99Ms = quantile(lags, 0.5), quantile(lags, 0.99)
	return p, nil
}

// overCommit counts differences between what Placement holds on the hosts'
// providers and what the hosts hold.
func overCommit(ctx context.Context, c *placementapi.Client, hosts []*host) (int, error) {
	bad := 0
	for _, h := range hosts {
		view, err := h.h.Manager.FleetView()
		if err != nil {
			return 0, err
		}
		for _, g := range view {
			have, err := c.ProviderAllocations(ctx, fleet.GPUProviderUUID(h.top, g.PCI))
			if err != nil {
				return 0, err
			}
			want := map[string]bool{}
			for _, r := range g.Records {
				want[r.Record.UUID] = true
				if _, ok := have[r.Record.UUID]; !ok {
					bad++
				}
			}
			for consumer := range have {
				if !want[consumer] {
					bad++
				}
			}
		}
	}
	return bad, nil
}

// lag destroys up to n instances and times each until Placement no longer
// holds its allocation.
func lag(ctx context.Context, c *placementapi.Client, hosts []*host, n int) ([]float64, error) {
	var out []float64
	for _, h := range hosts {
		views, err := h.h.Manager.AllInstances()
		if err != nil {
			return nil, err
		}
		for _, v := range views {
			if len(out) >= n {
				return out, nil
			}
			if err := h.h.Manager.Destroy(ctx, v.UUID, manager.DestroyOptions{}); err != nil {
				return nil, err
			}
			start := time.Now()
			for {
				cons, err := c.Consumer(ctx, v.UUID)
				if err != nil {
					return nil, err
				}
				if len(cons.Allocations) == 0 {
					break
				}
				if time.Since(start) > 30*time.Second {
					return nil, fmt.Errorf("allocation of %s still there after 30 s", v.UUID)
				}
				time.Sleep(2 * time.Millisecond)
			}
			out = append(out, float64(time.Since(start).Microseconds())/1000)
		}
	}
	return out, nil
}

func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[int(q*float64(len(s)-1)+0.5)]
}

// localPhase runs one phase's churn (same workers, operations and seed as
// the fleet's) through the hosts' local placement alone, then destroys up
// to 20 instances as the fleet phase's lag measurement does, so the next
// phase starts from a comparable load. It returns the acceptance.
func localPhase(ctx context.Context, hosts []*host, sh []tplacement.Host, workers, ops int, reqs []tplacement.Request) (float64, error) {
	sched := &tplacement.Scheduler{Hosts: sh, Local: true}
	if err := sched.Churn(ctx, workers, ops, reqs, uint64(workers)); err != nil {
		return 0, fmt.Errorf("%d local schedulers: %w", workers, err)
	}
	n := 0
	for _, h := range hosts {
		views, err := h.h.Manager.AllInstances()
		if err != nil {
			return 0, err
		}
		for _, v := range views {
			if n >= 20 {
				break
			}
			if err := h.h.Manager.Destroy(ctx, v.UUID, manager.DestroyOptions{}); err != nil {
				return 0, err
			}
			n++
		}
	}
	placed, full := sched.Placed.Load(), sched.NoCandidate.Load()
	if placed+full == 0 {
		return 0, nil
	}
	return float64(placed) / float64(placed+full), nil
}
