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
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// Resync is the whole fleet publishing itself again after Placement
// restarted on an empty database (its database lost), the hosts' syncers
// running as in the daemon, with local creates and destroys going on.
type Resync struct {
	// DownS is Placement's outage: stopped, database made again, started.
	DownS float64 `json:"downS"`
	// ConvergeS is from Placement answering again until every host had a
	// pass succeed (its whole tree, inventories and allocations written);
	// ConvergeP50S and ConvergeP99S the same per host.
	ConvergeS    float64 `json:"convergeS"`
	ConvergeP50S float64 `json:"convergeP50S"`
	ConvergeP99S float64 `json:"convergeP99S"`
	Converged    int     `json:"hostsConverged"`
	TimedOut     bool    `json:"timedOut"`
	// Placement5xx are the answers 500-599 Placement gave from the wipe
	// until convergence, Statuses all of them by status.
	Placement5xx int         `json:"placement5xx"`
	Statuses     map[int]int `json:"statuses"`
	// HostRequests are the syncers' requests until convergence, and per
	// second of it.
	HostRequests       uint64  `json:"hostRequests"`
	HostRequestsPerSec float64 `json:"hostRequestsPerSec"`
	// Local operations (creates and destroys without a scheduler) made on
	// random hosts meanwhile: a failure other than a full host is one
	// too many.
	LocalOps        int64 `json:"localOps"`
	LocalFailed     int64 `json:"localFailed"`
	LocalNoCapacity int64 `json:"localNoCapacity"`
	// OverCommit, PlacementOnly and Differences after convergence, as
	// Churn's.
	OverCommit    int      `json:"overCommit"`
	PlacementOnly int      `json:"placementOnly"`
	Differences   []string `json:"differences,omitempty"`
}

func runResync(ctx context.Context, srv *tplacement.Server, c *placementapi.Client, hosts []*host, timeout time.Duration) (Resync, error) {
	var r Resync
	s0, err := srv.Statuses()
	if err != nil {
		return r, err
	}
	h0 := hostRequests(hosts)
	stop := make(chan struct{})
	var ops, failed, full atomic.Int64
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			localOps(ctx, hosts, uint64(w), stop, &ops, &failed, &full)
		}()
	}
	start := time.Now()
	if err := srv.Wipe(); err != nil {
		close(stop)
		wg.Wait()
		return r, fmt.Errorf("wipe: %w", err)
	}
	up := time.Now()
	r.DownS = up.Sub(start).Seconds()
	done := make([]float64, len(hosts))
	left := len(hosts)
	for left > 0 && time.Since(up) < timeout {
		time.Sleep(250 * time.Millisecond)
		for i, h := range hosts {
			if done[i] > 0 {
				continue
			}
			at, err := h.lastSync()
			if err != nil {
				return r, err
			}
			if at.After(up) {
				done[i] = at.Sub(up).Seconds()
				left--
			}
		}
	}
	r.ConvergeS = time.Since(up).Seconds()
	r.TimedOut = left > 0
	close(stop)
	wg.Wait()
	var conv []float64
	for _, d := range done {
		if d > 0 {
			conv = append(conv, d)
		}
	}
	r.Converged = len(conv)
	r.ConvergeP50S, r.ConvergeP99S = quantile(conv, 0.5), quantile(conv, 0.99)
	if len(conv) == len(hosts) {
		r.ConvergeS = quantile(conv, 1)
	}
	r.HostRequests = hostRequests(hosts) - h0
	r.HostRequestsPerSec = float64(r.HostRequests) / time.Since(start).Seconds()
	s1, err := srv.Statuses()
	if err != nil {
		return r, err
	}
	r.Statuses = map[int]int{}
	for code, n := range s1 {
		if d := n - s0[code]; d > 0 {
			r.Statuses[code] = d
			if code >= 500 {
				r.Placement5xx += d
			}
		}
	}
	r.LocalOps, r.LocalFailed, r.LocalNoCapacity = ops.Load(), failed.Load(), full.Load()
	if r.OverCommit, r.PlacementOnly, r.Differences, err = settle(ctx, c, hosts); err != nil {
		return r, err
	}
	return r, nil
}

// localOps creates an instance on a random host and destroys it, again
// and again until stop closes, as an operator's vgpuctl would.
func localOps(ctx context.Context, hosts []*host, seed uint64, stop <-chan struct{}, ops, failed, full *atomic.Int64) {
	rnd := rand.New(rand.NewPCG(seed, 99))
	profiles := tplacement.ChurnProfiles
	for {
		select {
		case <-stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
		h := hosts[rnd.IntN(len(hosts))]
		in, err := h.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profiles[rnd.IntN(len(profiles))]})
		ops.Add(1)
		if errors.Is(err, manager.ErrNoCapacity) {
			full.Add(1)
			continue
		}
		if err != nil {
			failed.Add(1)
			continue
		}
		ops.Add(1)
		if err := h.h.Manager.Destroy(ctx, in.UUID, manager.DestroyOptions{}); err != nil {
			failed.Add(1)
		}
	}
}
