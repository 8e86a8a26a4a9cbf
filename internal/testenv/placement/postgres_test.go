package placement

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/placementapi"
)

// TestPostgresPlacement: Placement on its own PostgreSQL cluster keeps a
// provider, reports its database, counts its answers, and Wipe empties
// the database while the cluster goes on.
func TestPostgresPlacement(t *testing.T) {
	s := StartWith(t, Options{Postgres: true, Processes: 2})
	if got := s.Database(); got != "postgresql" {
		t.Fatalf("Database() = %q, want postgresql", got)
	}
	c, err := placementapi.New(placementapi.Config{Endpoint: s.URL(), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const id = "6f1c3c0e-0d5e-4bb4-9a51-8e2f3f6f0a01"
	if err := c.CreateProvider(ctx, id, "pg-host", ""); err != nil {
		t.Fatalf("create provider: %v", err)
	}
	if _, err := c.SetInventories(ctx, id, 0, map[string]placementapi.Inventory{"VGPU": {Total: 4, MinUnit: 1, MaxUnit: 4, StepSize: 1, AllocationRatio: 1}}); err != nil {
		t.Fatalf("inventory: %v", err)
	}
	if p, err := c.Provider(ctx, id); err != nil || p.Name != "pg-host" {
		t.Fatalf("provider = %+v, %v", p, err)
	}
	st, err := s.Statuses()
	if err != nil {
		t.Fatal(err)
	}
	if st[200] == 0 || st[500] != 0 {
		t.Fatalf("statuses %v: want some 200 and no 500", st)
	}
	if err := s.Wipe(); err != nil {
		t.Fatalf("wipe: %v", err)
	}
	if _, err := c.Provider(ctx, id); !errors.Is(err, placementapi.ErrNotFound) {
		t.Fatalf("provider after wipe: %v, want ErrNotFound", err)
	}
	if err := c.CreateProvider(ctx, id, "pg-host", ""); err != nil {
		t.Fatalf("create provider after wipe: %v", err)
	}
}
