package fleet

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// fakeClock is a clock a test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestGraceRunsOnTheSyncersClock: an allocation that names no instance
// goes once Grace has passed on the syncer's clock (Config.Now), however
// little wall time went by, and not before.
func TestGraceRunsOnTheSyncersClock(t *testing.T) {
	srv, c := startPlacement(t)
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := startHost(t, "hosta", srv.URL(), nil, Config{Grace: time.Hour, Now: clock.now})
	ctx := context.Background()
	a.pass(t)
	id := uuid.NewString()
	if err := claim(c, id, GPUProviderUUID(a.s.top(), sim.DefaultL4), map[string]int{"CUSTOM_VGPUD_L4_4Q": 1}); err != nil {
		t.Fatal(err)
	}
	a.pass(t) // first seen now
	clock.advance(59 * time.Minute)
	a.pass(t)
	if cons, _ := c.Consumer(ctx, id); len(cons.Allocations) == 0 {
		t.Fatal("orphan removed 59 minutes into its hour of grace")
	}
	clock.advance(time.Minute)
	a.pass(t)
	if cons, _ := c.Consumer(ctx, id); len(cons.Allocations) != 0 {
		t.Fatal("orphan kept after an hour on the syncer's clock")
	}
}
