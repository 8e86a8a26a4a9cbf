package manager_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
)

// recordingFleet is a fleet that records what the manager asks of it.
type recordingFleet struct {
	mu                sync.Mutex
	settled, unclaims []string
}

func (f *recordingFleet) Claim(context.Context, manager.FleetClaim) error {
	return errors.New("not asked in this test")
}

func (f *recordingFleet) Unclaim(instance string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unclaims = append(f.unclaims, instance)
}

func (f *recordingFleet) Adopt(context.Context, string) (manager.FleetClaim, error) {
	return manager.FleetClaim{}, manager.ErrNotFound
}

func (f *recordingFleet) Complete(context.Context, manager.FleetClaim) error { return nil }

func (f *recordingFleet) Settle(_ context.Context, _, removed string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.settled = append(f.settled, removed)
}

// TestReconcileLeavesSettleToTheFleet: a destroy a crash left, finished by
// reconcile under the admission lock, does not wait on the fleet (Settle,
// bounded by a Placement round trip, would hold every create and destroy
// meanwhile): its allocation is handed to the fleet's next pass (Unclaim),
// which never blocks. A destroy outside reconcile settles as before.
func TestReconcileLeavesSettleToTheFleet(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	left := e.mustCreate("acme", "L4-4Q", sim.DefaultL4)
	other := e.mustCreate("acme", "L4-4Q", sim.DefaultL4)
	e.crash = func(at string) {
		if at == manager.CrashDestroyStart {
			runtime.Goexit()
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = e.m.Destroy(context.Background(), left.UUID, manager.DestroyOptions{})
	}()
	<-done
	e.crash = nil
	f := &recordingFleet{}
	e.m.SetFleet(f)
	defer e.m.SetFleet(nil)
	if _, err := e.m.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Instance(left.UUID); !errors.Is(err, manager.ErrNotFound) {
		t.Fatalf("the destroy a crash left was not finished: %v", err)
	}
	f.mu.Lock()
	settled, unclaims := slices.Clone(f.settled), slices.Clone(f.unclaims)
	f.mu.Unlock()
	if len(settled) != 0 || !slices.Equal(unclaims, []string{left.UUID}) {
		t.Fatalf("reconcile asked the fleet to settle %v and to drop %v; want no settle and %s dropped", settled, unclaims, left.UUID)
	}
	if err := e.m.Destroy(context.Background(), other.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Equal(f.settled, []string{other.UUID}) {
		t.Fatalf("a destroy outside reconcile settled %v; want %s", f.settled, other.UUID)
	}
}
