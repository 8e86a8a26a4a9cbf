package manager_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
)

// recordingFleet is a fleet that records what the manager asks of it.
type recordingFleet struct {
	mu                sync.Mutex
	settled, unclaims []string
	// claimErr and settleErr are what Claim and Settle answer (nil: a
	// claim is not expected and fails).
	claimErr, settleErr error
	claimOK             bool
	// open counts the expectations not ended (Expect); expected notes,
	// for each Settle, whether one was open.
	open, expects int
	expected      []bool
}

func (f *recordingFleet) Expect() func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.open++
	f.expects++
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.open--
		})
	}
}

func (f *recordingFleet) Claim(context.Context, manager.FleetClaim) error {
	if f.claimOK {
		return nil
	}
	if f.claimErr != nil {
		return f.claimErr
	}
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

func (f *recordingFleet) Move(context.Context, string, string) error { return nil }

func (f *recordingFleet) Stale(context.Context, string, string) {}

func (f *recordingFleet) Settle(_ context.Context, _, removed string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.settled = append(f.settled, removed)
	f.expected = append(f.expected, f.open > 0)
	return f.settleErr
}

// TestReconcileLeavesSettleToTheFleet: a destroy a crash left, finished by
// reconcile under the admission lock, does not wait on the fleet (Settle,
// bounded by a Placement round trip, would hold every create and destroy
// meanwhile): its allocation is handed to the fleet's next pass (Unclaim),
// which never blocks. A destroy outside reconcile settles as before, and
// so does a create, each inside the expectation it told the fleet of
// before its first event (Expect), which ends with the operation.
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
	settled, unclaims, expects := slices.Clone(f.settled), slices.Clone(f.unclaims), f.expects
	f.mu.Unlock()
	if len(settled) != 0 || !slices.Equal(unclaims, []string{left.UUID}) {
		t.Fatalf("reconcile asked the fleet to settle %v and to drop %v; want no settle and %s dropped", settled, unclaims, left.UUID)
	}
	if expects != 0 {
		t.Fatalf("reconcile told the fleet %d times to expect a settle; want none (it settles nothing)", expects)
	}
	if err := e.m.Destroy(context.Background(), other.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "L4-4Q", GPU: sim.DefaultL4}); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Equal(f.settled, []string{other.UUID, ""}) {
		t.Fatalf("a destroy and a create outside reconcile settled %v; want %s, then the create's GPU alone", f.settled, other.UUID)
	}
	if !slices.Equal(f.expected, []bool{true, true}) || f.open != 0 {
		t.Fatalf("settles inside an expectation: %v, expectations left open: %d; want every settle expected, none left open", f.expected, f.open)
	}
}

// TestOperationsReportWhatPlacementLacks: a create or destroy that
// succeeds although Placement was not brought up to date (its claim not
// written before carving, its GPU's inventory or its allocation removal
// left to the sync) says so to its caller through the operation's
// outcome; one that kept every promise says nothing.
func TestOperationsReportWhatPlacementLacks(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	down := errors.New("placement: unreachable: connection refused")
	f := &recordingFleet{claimErr: down, settleErr: down}
	e.m.SetFleet(f)
	defer e.m.SetFleet(nil)

	ctx, o := manager.WithPlacementOutcome(context.Background())
	rec, err := e.m.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "L4-4Q", GPU: sim.DefaultL4})
	if err != nil {
		t.Fatal(err)
	}
	got := o.Behind()
	for _, want := range []string{"allocation not written before carving", "not brought up to date before returning", "unreachable"} {
		if !strings.Contains(got, want) {
			t.Errorf("create's outcome %q does not say %q", got, want)
		}
	}

	ctx, o = manager.WithPlacementOutcome(context.Background())
	if err := e.m.Destroy(ctx, rec.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := o.Behind(); !strings.Contains(got, "not brought up to date before returning") || strings.Contains(got, "carving") {
		t.Errorf("destroy's outcome %q: want the settle left to the sync, nothing about a claim", got)
	}

	// Every promise kept: nothing to say.
	f.mu.Lock()
	f.claimOK, f.settleErr = true, nil
	f.mu.Unlock()
	ctx, o = manager.WithPlacementOutcome(context.Background())
	rec, err = e.m.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "L4-4Q", GPU: sim.DefaultL4})
	if err != nil {
		t.Fatal(err)
	}
	if got := o.Behind(); got != "" {
		t.Errorf("a create that kept its promises reports %q", got)
	}
	// An operation without an outcome (apply, reconcile) notes nowhere.
	if err := e.m.Destroy(context.Background(), rec.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
}
