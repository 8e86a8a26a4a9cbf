package fleet

import (
	"context"
	"testing"
	"time"

	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
)

// TestClaimReadsOneGPU: a create's claim and settle read the GPU they
// concern (FleetGPUByUUID), never the whole host's view, which is the
// pass's; the claim is written all the same.
func TestClaimReadsOneGPU(t *testing.T) {
	srv, c := startPlacement(t)
	h := simhost.Start(t, simhost.Options{})
	simhost.DefineTenant(t, h.Manager, "acme")
	src := &countingSource{Source: h.Manager}
	s, err := New(Config{Host: "hosta"}, newClient(t, srv.URL()), src, quietLog(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	h.Manager.SetFleet(s)
	ctx := context.Background()
	if err := s.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	src.views.Store(0)
	rec, err := h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "L4-4Q", GPU: sim.DefaultL4})
	if err != nil {
		t.Fatal(err)
	}
	if n := src.views.Load(); n != 0 {
		t.Fatalf("a create read the whole host's fleet view %d times", n)
	}
	cons, err := c.Consumer(ctx, rec.UUID)
	if err != nil || len(cons.Allocations) != 1 {
		t.Fatalf("the create's claim: %+v, %v", cons, err)
	}
}

// TestAdoptReadsOneGPU: a create for a scheduler's consumer finds the GPU
// from the allocation's provider and reads that GPU alone, never the
// whole host's view; the instance lands on the GPU the scheduler chose.
func TestAdoptReadsOneGPU(t *testing.T) {
	srv, c := startPlacement(t)
	h := simhost.Start(t, simhost.Options{})
	simhost.DefineTenant(t, h.Manager, "acme")
	src := &countingSource{Source: h.Manager}
	s, err := New(Config{Host: "hosta"}, newClient(t, srv.URL()), src, quietLog(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	h.Manager.SetFleet(s)
	ctx := context.Background()
	if err := s.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	id := schedulerClaims(t, c, "CUSTOM_VGPUD_MIG_3G_40GB:1,CUSTOM_VGPUD_MIG_SLICE:4")
	src.views.Store(0)
	rec, err := h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb", PlacementConsumer: id})
	if err != nil || rec.UUID != id || rec.GPUPCI != sim.DefaultH100MIG {
		t.Fatalf("adopting create = %+v, %v", rec, err)
	}
	if n := src.views.Load(); n != 0 {
		t.Fatalf("an adopting create read the whole host's fleet view %d times", n)
	}
}

// TestAdoptWaitsPastClaimTimeout: a scheduler's create cannot carve
// without reading its allocation, so a Placement slower than claimTimeout
// (but within AdoptTimeout) delays the create instead of refusing it; a
// refusal would cost the scheduler a reschedule for nothing.
func TestAdoptWaitsPastClaimTimeout(t *testing.T) {
	srv, c := startPlacement(t)
	proxy := tplacement.StartProxy(t, srv)
	h := simhost.Start(t, simhost.Options{})
	simhost.DefineTenant(t, h.Manager, "acme")
	s, err := New(Config{Host: "hosta", ClaimTimeout: 500 * time.Millisecond, AdoptTimeout: 20 * time.Second}, newClient(t, proxy.URL()), h.Manager, quietLog(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	h.Manager.SetFleet(s)
	ctx := context.Background()
	if err := s.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	id := schedulerClaims(t, c, "CUSTOM_VGPUD_MIG_3G_40GB:1,CUSTOM_VGPUD_GPU:1,CUSTOM_VGPUD_MIG_SLICE:4")
	// Every connection of the host's client is reset (none stays open to
	// slip past the hold), then the host's next requests wait unanswered
	// for twice claimTimeout.
	proxy.Cut()
	proxy.Restore()
	proxy.Hold()
	released := time.AfterFunc(time.Second, proxy.Release)
	defer released.Stop()
	start := time.Now()
	rec, err := h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb", PlacementConsumer: id})
	if err != nil {
		t.Fatalf("a scheduler's create while Placement answered in 1 s (claimTimeout 500ms) = %v", err)
	}
	if took := time.Since(start); rec.UUID != id || took < time.Second {
		t.Fatalf("adopting create = %+v after %v; want the consumer's instance, after the hold", rec, took)
	}
}
