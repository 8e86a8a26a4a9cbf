package fleet

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
	"github.com/vgpud/vgpud/pkg/store"
)

// crashHost is a simulated host whose manager dies at a crash point and
// starts again on the same state with a new syncer, as a daemon killed
// with SIGKILL and started again does (the syncer is set before the
// start-up reconcile, as the daemon sets it).
type crashHost struct {
	host
	mu sync.Mutex
	at string
}

func (h *crashHost) crash(p string) {
	h.mu.Lock()
	die := p == h.at
	if die {
		h.at = ""
	}
	h.mu.Unlock()
	if die {
		runtime.Goexit() // the operation ends here, as the process would
	}
}

func startCrashHost(t *testing.T, name string, c *placementapi.Client) *crashHost {
	t.Helper()
	ch := &crashHost{host: host{name: name}}
	ch.h = simhost.Start(t, simhost.Options{
		Manager: manager.Config{Crash: ch.crash},
		BeforeReconcile: func(m *manager.Manager) {
			s, err := New(Config{Host: name, Grace: time.Hour}, c, m, quietLog(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			ch.s = s
			m.SetFleet(s)
		},
	})
	simhost.DefineTenant(t, ch.h.Manager, "acme")
	return ch
}

// TestFleetCreateCrashPoints: a fleet create cut off at each of its crash
// points, with a scheduler that does what Nova does on the failure
// (deletes its allocation and places the same consumer on another host),
// is undone at restart and its allocation is never written back; with a
// scheduler that keeps its claim, a create whose parts are all there is
// finished and the rest undone, the allocation left as the scheduler
// wrote it.
func TestFleetCreateCrashPoints(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	other := startHost(t, "elsewhere", srv.URL(), nil, Config{})
	other.pass(t)
	type prof struct {
		name, pci string
		kind      store.InstanceKind
		points    []string
		// complete: from this point on every part is on the host.
		complete string
		res      map[string]int
	}
	profiles := []prof{
		{"3g.40gb", sim.DefaultH100MIG, store.KindMIG,
			[]string{manager.CrashCreateIntent, manager.CrashCreateGI, manager.CrashCreateCI, manager.CrashCreateCommit}, manager.CrashCreateCI,
			map[string]int{ClassName(store.KindMIG, "3g.40gb"): 1, SliceClass: 4, GPUClass: 1}},
		{"L4-4Q", sim.DefaultL4, store.KindVGPU,
			[]string{manager.CrashCreateIntent, manager.CrashCreateVGPU, manager.CrashCreateCommit}, manager.CrashCreateVGPU,
			map[string]int{ClassName(store.KindVGPU, "L4-4Q"): 1, FramebufferClass: 4096, GPUClass: 1}},
	}
	covered := map[string]bool{}
	n := 0
	for _, p := range profiles {
		for _, point := range p.points {
			for _, resched := range []bool{true, false} {
				covered[point] = true
				n++
				name := fmt.Sprintf("crash%d", n)
				t.Run(fmt.Sprintf("%s/%s/reschedule=%v", p.name, point, resched), func(t *testing.T) {
					a := startCrashHost(t, name, c)
					a.pass(t)
					mine := GPUProviderUUID(RootUUID(name), p.pci)
					theirs := GPUProviderUUID(RootUUID("elsewhere"), p.pci)
					id := uuid.NewString()
					if err := claim(c, id, mine, p.res); err != nil {
						t.Fatal(err)
					}
					// The other host's room is the next subtest's.
					t.Cleanup(func() { _ = c.PutConsumer(ctx, id, placementapi.Consumer{}) })
					a.mu.Lock()
					a.at = point
					a.mu.Unlock()
					done := make(chan error, 1)
					go func() {
						defer close(done)
						_, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: p.name, PlacementConsumer: id})
						done <- err
					}()
					if err, finished := <-done; finished {
						t.Fatalf("the create was not cut off at %s: %v", point, err)
					}
					if resched {
						// The scheduler saw the create fail: it deletes its
						// allocation and places the same consumer elsewhere.
						if err := c.PutConsumer(ctx, id, placementapi.Consumer{}); err != nil {
							t.Fatal(err)
						}
						if err := claim(c, id, theirs, p.res); err != nil {
							t.Fatal(err)
						}
					}
					if err := a.h.Restart(ctx); err != nil {
						t.Fatal(err)
					}
					rep := a.h.Report
					kept := slices.Contains(rep.Finished, id)
					if undone := slices.Contains(rep.Undone, id); kept == undone {
						t.Fatalf("restart: finished %v, undone %v; want the create settled one way", rep.Finished, rep.Undone)
					}
					wantKept := !resched && slices.Index(p.points, point) >= slices.Index(p.points, p.complete)
					if kept != wantKept {
						t.Fatalf("restart kept the instance: %v, want %v (report %+v)", kept, wantKept, rep)
					}
					if _, ok := simhost.InstanceStates(t, a.h.Manager)[id]; ok != kept {
						t.Fatalf("instance on the host after restart: %v, want %v", ok, kept)
					}
					// Nothing left on the host: a second reconcile finds no
					// device no record explains.
					again, err := a.h.Manager.Reconcile(ctx)
					if err != nil || len(again.Foreign) != 0 {
						t.Fatalf("second reconcile: foreign %+v, %v", again.Foreign, err)
					}
					for try := 0; try < 3; try++ {
						a.pass(t)
					}
					cons, err := c.Consumer(ctx, id)
					if err != nil {
						t.Fatal(err)
					}
					want := mine
					if resched {
						want = theirs
					}
					if len(cons.Allocations) != 1 || !sameResources(cons.Allocations[want].Resources, p.res) {
						t.Fatalf("consumer after restart and passes: %+v; want only %v on %s", cons.Allocations, p.res, want)
					}
					if !resched {
						return
					}
					// The host's own view agrees: nothing of the consumer.
					view, err := a.h.Manager.FleetView()
					if err != nil {
						t.Fatal(err)
					}
					for _, g := range view {
						for _, r := range g.Records {
							if r.Record.UUID == id {
								t.Fatalf("the host still holds %s on %s", id, g.PCI)
							}
						}
					}
				})
			}
		}
	}
	for _, p := range []string{manager.CrashCreateIntent, manager.CrashCreateGI, manager.CrashCreateCI, manager.CrashCreateVGPU, manager.CrashCreateCommit} {
		if !covered[p] {
			t.Errorf("crash point %s of a create is not covered", p)
		}
	}
}

// TestFleetCreateAllocationDeletedMeanwhile: a scheduler that gives up
// while its create runs (deletes the allocation, places the consumer on
// another host) finds it refused as StaleClaim with nothing on the host,
// and no pass meanwhile writes the allocation back.
func TestFleetCreateAllocationDeletedMeanwhile(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	other := startHost(t, "elsewhere", srv.URL(), nil, Config{})
	other.pass(t)
	paused, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	a := &crashHost{host: host{name: "hosta"}}
	a.h = simhost.Start(t, simhost.Options{Manager: manager.Config{Crash: func(p string) {
		if p == manager.CrashCreateGI {
			once.Do(func() { close(paused); <-resume })
		}
	}}})
	simhost.DefineTenant(t, a.h.Manager, "acme")
	s, err := New(Config{Host: "hosta", Grace: time.Hour}, c, a.h.Manager, quietLog(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	a.s = s
	a.h.Manager.SetFleet(s)
	a.pass(t)
	res := map[string]int{ClassName(store.KindMIG, "3g.40gb"): 1, SliceClass: 4, GPUClass: 1}
	id := uuid.NewString()
	if err := claim(c, id, GPUProviderUUID(RootUUID("hosta"), sim.DefaultH100MIG), res); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb", PlacementConsumer: id})
		done <- err
	}()
	<-paused
	theirs := GPUProviderUUID(RootUUID("elsewhere"), sim.DefaultH100MIG)
	if err := c.PutConsumer(ctx, id, placementapi.Consumer{}); err != nil {
		t.Fatal(err)
	}
	if err := claim(c, id, theirs, res); err != nil {
		t.Fatal(err)
	}
	// A pass while the create runs: the scheduler's deletion stands.
	if err := a.s.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	cons, err := c.Consumer(ctx, id)
	if err != nil || len(cons.Allocations) != 1 || cons.Allocations[theirs].Resources == nil {
		t.Fatalf("consumer after a pass during the create: %+v, %v; want it on the other host only", cons.Allocations, err)
	}
	close(resume)
	err = <-done
	if !errors.Is(err, manager.ErrStaleClaim) || manager.Name(err) != "StaleClaim" {
		t.Fatalf("create whose allocation went meanwhile = %v, want StaleClaim", err)
	}
	if _, ok := simhost.InstanceStates(t, a.h.Manager)[id]; ok {
		t.Fatal("the instance stayed on the host")
	}
	for try := 0; try < 3; try++ {
		a.pass(t)
	}
	cons, err = c.Consumer(ctx, id)
	if err != nil || len(cons.Allocations) != 1 || cons.Allocations[theirs].Resources == nil {
		t.Fatalf("consumer after the create and passes: %+v, %v; want it on the other host only", cons.Allocations, err)
	}
}
