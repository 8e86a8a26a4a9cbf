package fleet

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
	"github.com/vgpud/vgpud/pkg/store"
)

// TestRetryNeverPastInterval: while Placement does not answer, the retry
// doubles from 1 s but never waits longer than the interval, so a
// Placement that answers again is synced with within one interval.
func TestRetryNeverPastInterval(t *testing.T) {
	for _, interval := range []time.Duration{300 * time.Millisecond, 5 * time.Second, time.Minute} {
		retry, reached := time.Duration(0), false
		for i := 0; i < 20; i++ {
			next := retryAfter(retry, interval)
			if next > interval || next <= 0 || next < retry {
				t.Fatalf("interval %s: retry after %s is %s", interval, retry, next)
			}
			reached = reached || next == interval
			retry = next
		}
		if first := retryAfter(0, interval); first != min(time.Second, interval) || !reached {
			t.Fatalf("interval %s: first retry %s, reached the interval: %v", interval, first, reached)
		}
	}
}

// countingSource counts the passes that began (each reads the view once).
type countingSource struct {
	Source
	views atomic.Int64
}

func (c *countingSource) FleetView() ([]manager.FleetGPU, error) {
	c.views.Add(1)
	return c.Source.FleetView()
}

// TestRetryNotPutOffByEvents: while Placement does not answer, events
// that start no pass (tenants defined, every 50 ms here) do not put the
// retry off: passes come 1 s, then 2 s after the first failure, though
// the periodic pass is an hour away.
func TestRetryNotPutOffByEvents(t *testing.T) {
	h := simhost.Start(t, simhost.Options{})
	src := &countingSource{Source: h.Manager}
	s, err := New(Config{Host: "hosta", Interval: time.Hour}, newClient(t, "http://127.0.0.1:1"), src, quietLog(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	for i := 0; i < 70; i++ { // 3.5 s
		simhost.DefineTenant(t, h.Manager, fmt.Sprintf("t%d", i))
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	<-done
	if n := src.views.Load(); n < 3 {
		t.Fatalf("%d passes in 3.5 s with Placement down; want the first and its retries after 1 s and 2 s more", n)
	}
}

// TestPassCrashPoints: a pass reaches each of its crash points, and a
// syncer that died there (a restart: a new syncer, nothing cached) makes
// Placement equal the host again.
func TestPassCrashPoints(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	a := startHost(t, "hosta", srv.URL(), nil, Config{})
	mig := GPUProviderUUID(RootUUID("hosta"), sim.DefaultH100MIG)
	var rec store.Instance
	steps := []struct {
		point string
		// before makes the dying syncer's next pass reach the point.
		before func(t *testing.T, dying *Syncer)
	}{
		// A fresh root: the first GPU provider is made, then the pass dies.
		{CrashProvider, func(*testing.T, *Syncer) {}},
		{CrashInventory, func(*testing.T, *Syncer) {}},
		// An allocation Placement lost: the pass writes it again.
		{CrashAlloc, func(t *testing.T, _ *Syncer) {
			var err error
			if rec, err = a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb", GPU: sim.DefaultH100MIG}); err != nil {
				t.Fatal(err)
			}
			converged(t, c, a)
			if err := c.PutConsumer(ctx, rec.UUID, placementapi.Consumer{}); err != nil {
				t.Fatal(err)
			}
		}},
		// An instance a pass saw is destroyed while the destroy could not
		// remove its allocation itself (no fleet then): the next pass
		// removes it at once.
		{CrashUnalloc, func(t *testing.T, dying *Syncer) {
			if err := dying.Pass(ctx); err != nil {
				t.Fatal(err)
			}
			a.h.Manager.SetFleet(nil)
			defer a.h.Manager.SetFleet(dying)
			if err := a.h.Manager.Destroy(ctx, rec.UUID, manager.DestroyOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, st := range steps {
		reached := make(chan string, 1)
		dying, err := New(Config{Host: "hosta", Grace: time.Hour, Crash: func(p string) {
			if p == st.point {
				reached <- p
				runtime.Goexit() // the pass ends here, as the process would
			}
		}}, c, a.h.Manager, quietLog(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		a.h.Manager.SetFleet(dying)
		st.before(t, dying)
		done := make(chan struct{})
		go func() { defer close(done); _ = dying.Pass(ctx) }()
		<-done
		select {
		case <-reached:
		default:
			t.Fatalf("the pass did not reach %s", st.point)
		}
		// Restarted: a new syncer, nothing cached, converges.
		s, err := New(Config{Host: "hosta", Grace: time.Hour}, c, a.h.Manager, quietLog(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		a.s = s
		a.h.Manager.SetFleet(s)
		converged(t, c, a)
		if st.point == CrashProvider {
			if tree, err := c.Tree(ctx, RootUUID("hosta")); err != nil || len(tree) != 5 {
				t.Fatalf("after a crash at %s and a pass: tree %v, %v; want root and 4 GPUs", st.point, tree, err)
			}
			if inv, _, err := c.Inventories(ctx, mig); err != nil || inv[SliceClass].Total != 8 {
				t.Fatalf("after a crash at %s and a pass: inventories %v, %v", st.point, inv, err)
			}
		}
	}
	if cons, err := c.Consumer(ctx, rec.UUID); err != nil || len(cons.Allocations) != 0 {
		t.Fatalf("allocation of the destroyed instance: %+v, %v", cons, err)
	}
}
