package fleet

import (
	"context"
	"testing"

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
