package simhost_test

import (
	"context"
	"testing"

	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// TestRestartKeepsState: a restart makes a new store handle and manager
// over the same state, whose reconcile finds the instance made before it
// on the host; Close may be called again.
func TestRestartKeepsState(t *testing.T) {
	h := simhost.Start(t, simhost.Options{Manager: manager.Config{BusyRetry: 1}})
	simhost.DefineTenant(t, h.Manager, "acme")
	in := simhost.MustCreate(t, h.Manager, "acme", "1g.10gb", sim.DefaultH100MIG)
	before := h.Manager
	if err := h.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	if h.Manager == before {
		t.Fatal("restart kept the manager")
	}
	if len(h.Report.Recreated) != 0 || len(h.Report.Foreign) != 0 {
		t.Fatalf("reconcile after the restart: %+v", h.Report)
	}
	if got := simhost.InstanceStates(t, h.Manager)[in.UUID]; got != store.StateReady {
		t.Fatalf("instance %s after the restart: %q", in.UUID, got)
	}
	if line := simhost.SummaryLine(mustSummary(t, h.Sim), sim.DefaultH100MIG); line == "" {
		t.Fatalf("no summary line for %s", sim.DefaultH100MIG)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

func mustSummary(t *testing.T, h *sim.Host) string {
	t.Helper()
	s, err := h.Summary()
	if err != nil {
		t.Fatal(err)
	}
	return s
}
