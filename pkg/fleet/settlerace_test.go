package fleet

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// hookedSource is the host with a hook on HasConsumer: it lets a test run
// a destroy at the moment a pass has decided to write an allocation.
type hookedSource struct {
	*manager.Manager
	hook func(id string)
}

// HasConsumer answers, then runs the hook: what the caller does next
// follows an answer the hook may have made stale.
func (s hookedSource) HasConsumer(id string) bool {
	ok := s.Manager.HasConsumer(id)
	s.hook(id)
	return ok
}

// TestDestroyNotUndoneByAPass: a pass that read the host before a destroy
// and writes the destroyed instance's allocation (missing in Placement)
// while the destroy runs must not leave it in Placement once the destroy
// returned; the destroy's reply promises its allocation is gone. A
// scheduler that then claims under the same UUID (Nova reuses instance
// UUIDs), before the pass has finished, keeps its claim through that pass
// and the next: neither takes it for the destroyed instance's leftover.
func TestDestroyNotUndoneByAPass(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	h := simhost.Start(t, simhost.Options{})
	simhost.DefineTenant(t, h.Manager, "acme")

	var (
		mu        sync.Mutex
		target    string
		calls     int
		behind    string
		destroyed = make(chan error, 1)
		checked   = make(chan string, 1)
		claimed   bool
	)
	src := hookedSource{Manager: h.Manager}
	src.hook = func(id string) {
		mu.Lock()
		if id != target {
			mu.Unlock()
			return
		}
		calls++
		n := calls
		mu.Unlock()
		switch n {
		case 1:
			// The pass is about to write: destroy now, and give the
			// destroy time to finish before the write lands.
			go func() {
				octx, outcome := manager.WithPlacementOutcome(ctx)
				err := h.Manager.Destroy(octx, id, manager.DestroyOptions{})
				mu.Lock()
				behind = outcome.Behind()
				mu.Unlock()
				destroyed <- err
			}()
			select {
			case err := <-destroyed:
				destroyed <- err
			case <-time.After(500 * time.Millisecond):
			}
		case 2:
			// The write landed. Once the destroy has returned, its
			// allocation must be gone.
			err := <-destroyed
			destroyed <- err
			if err != nil {
				checked <- "destroy: " + err.Error()
				return
			}
			mu.Lock()
			said := behind
			mu.Unlock()
			cons, err := c.Consumer(ctx, id)
			switch {
			case said != "":
				// The destroy said it left the removal to the sync.
				checked <- ""
			case err != nil:
				checked <- "read consumer: " + err.Error()
			case len(cons.Allocations) != 0:
				checked <- "the allocation is in Placement after the destroy returned: a pass put it back"
			default:
				if err := claim(c, id, GPUProviderUUID(RootUUID("race"), sim.DefaultL4), l4x4Q); err != nil {
					checked <- "claim again: " + err.Error()
					return
				}
				mu.Lock()
				claimed = true
				mu.Unlock()
				checked <- ""
			}
		}
	}
	s, err := New(Config{Host: "race", Grace: time.Hour, ClaimTimeout: 10 * time.Second, SettleTimeout: 10 * time.Second}, newClient(t, srv.URL()), src, quietLog(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	h.Manager.SetFleet(s)
	if err := s.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "NVIDIA L4-4Q", GPU: sim.DefaultL4})
	if err != nil {
		t.Fatal(err)
	}
	// Placement loses the allocation: the next pass writes it back.
	if err := c.Do(ctx, "DELETE", "/allocations/"+rec.UUID, nil, nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	target = rec.UUID
	mu.Unlock()
	if err := s.Pass(ctx); err != nil {
		t.Fatalf("pass: %v", err)
	}
	if err := <-destroyed; err != nil {
		t.Fatalf("destroy: %v", err)
	}
	select {
	case msg := <-checked:
		if msg != "" {
			t.Fatal(msg)
		}
	default:
		// The pass saw the instance gone at once: nothing was written.
	}
	mu.Lock()
	again := claimed
	mu.Unlock()
	if !again {
		if cons, err := c.Consumer(ctx, rec.UUID); err != nil || len(cons.Allocations) != 0 {
			t.Fatalf("after the pass: %+v, %v", cons, err)
		}
		return
	}
	for i, what := range []string{"the pass that wrote the destroyed instance's allocation", "the pass after it"} {
		if i > 0 {
			if err := s.Pass(ctx); err != nil {
				t.Fatalf("pass: %v", err)
			}
		}
		if cons, err := c.Consumer(ctx, rec.UUID); err != nil || len(cons.Allocations) == 0 {
			t.Fatalf("the scheduler's new claim under the destroyed instance's UUID after %s: %+v, %v", what, cons, err)
		}
	}
}

// viewHookedSource runs a hook after the whole host's view is read, before
// the pass that read it writes anything.
type viewHookedSource struct {
	*manager.Manager
	hook func()
}

func (s viewHookedSource) FleetView() ([]manager.FleetGPU, error) {
	v, err := s.Manager.FleetView()
	s.hook()
	return v, err
}

// TestPassDoesNotTakeBackRoom: a pass that read the host while an instance
// was on a GPU must not publish that GPU's inventory as it was then once
// the instance's destroy has published the room it freed: a scheduler
// would be refused the room (a whole GPU's class gone from an empty GPU)
// until the next pass.
func TestPassDoesNotTakeBackRoom(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	h := simhost.Start(t, simhost.Options{})
	simhost.DefineTenant(t, h.Manager, "acme")

	var once sync.Once
	var id string
	src := viewHookedSource{Manager: h.Manager}
	src.hook = func() {
		if id == "" {
			return
		}
		once.Do(func() {
			if err := h.Manager.Destroy(ctx, id, manager.DestroyOptions{}); err != nil {
				t.Errorf("destroy: %v", err)
			}
		})
	}
	s, err := New(Config{Host: "room", Grace: time.Hour, ClaimTimeout: 10 * time.Second, SettleTimeout: 10 * time.Second}, newClient(t, srv.URL()), src, quietLog(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	h.Manager.SetFleet(s)
	if err := s.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	prov := GPUProviderUUID(s.top(), sim.DefaultL4)
	empty, _, err := c.Inventories(ctx, prov)
	if err != nil {
		t.Fatal(err)
	}
	whole := ClassName(store.KindPassthrough, "passthrough")
	if _, ok := empty[whole]; !ok {
		t.Fatalf("the empty GPU offers no %s: %v", whole, empty)
	}
	rec, err := h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "NVIDIA L4-4Q", GPU: sim.DefaultL4})
	if err != nil {
		t.Fatal(err)
	}
	if held, _, err := c.Inventories(ctx, prov); err != nil || held[whole].Total != 0 {
		t.Fatalf("with an instance on it the GPU still offers %s: %v, %v", whole, held, err)
	}
	// The next pass reads the host with the instance on it; the instance
	// is destroyed (and its room published) before the pass writes.
	id = rec.UUID
	if err := s.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	after, _, err := c.Inventories(ctx, prov)
	if err != nil {
		t.Fatal(err)
	}
	for rc, inv := range empty {
		if after[rc].Total != inv.Total || after[rc].Reserved != inv.Reserved {
			t.Errorf("after the pass %s is %+v on the empty GPU, was %+v before the create: the pass published the host it read before the destroy", rc, after[rc], inv)
		}
	}
}

// TestLateRemovalEventSparesNewClaim: a destroyed instance's removal
// event taken late (queued behind a long pass) after a scheduler claimed
// under the same UUID and the host took the claim (Adopt's reset) marks
// nothing: the next pass keeps the new claim.
func TestLateRemovalEventSparesNewClaim(t *testing.T) {
	srv, c := startPlacement(t)
	a := startHost(t, "hostl", srv.URL(), nil, Config{})
	a.pass(t)
	rec := create(t, a, "NVIDIA L4-4Q", sim.DefaultL4)
	destroy(t, a, rec.UUID) // its settle removes the allocation
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)
	if err := claim(c, rec.UUID, l4, l4x4Q); err != nil {
		t.Fatal(err)
	}
	a.s.reset(rec.UUID)
	a.s.take(manager.Event{Kind: manager.EventInstanceRemoved, ID: rec.UUID})
	a.pass(t)
	if r := holds(t, c, rec.UUID, l4); len(r) == 0 {
		t.Fatal("the pass removed a new claim under a destroyed instance's UUID on the destroy's late event")
	}
}
