package nvml

import (
	"context"
	"fmt"
	"sync"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// The session gate. NVML's session belongs to the whole process: the
// driver refuses a GPU reset while the process holds the GPU's device node
// open, and only Shutdown closes it, for every GPU at once. So a reset
// pauses every NVML caller in vgpud (the metrics, the share loop, the
// inventory, the manager's writers): every call enters the gate, and a
// reset closes it (CloseSession), waits for the calls in flight, shuts
// NVML down, lets the sysfs steps run, initializes NVML again and reopens
// it (OpenSession). Device handles are invalid after Shutdown and GPU
// indexes may change across it: what the backend keeps between calls is
// keyed by UUID, and a Probe's handle is looked up again in the new
// session (generation).

// gate admits NVML calls while open and holds them while a reset has the
// session. A reset waiting for the calls in flight already holds new ones
// back, so a steady stream of readers cannot keep it out.
type gate struct {
	mu      sync.Mutex
	readers int
	// closed: a reset holds the session or waits for the calls in flight.
	closed bool
	// open is closed when the gate opens again; nil while it is open.
	open chan struct{}
	// drained is closed when the last call in flight leaves a closed gate.
	drained chan struct{}
	// gpu is the GPU whose reset holds the gate.
	gpu string
	// gen counts the sessions begun after a reset: a handle looked up in
	// an earlier one is invalid.
	gen uint64
}

// enter admits a call, waiting while a reset holds the session. A call
// whose context ends first gets gpu.ErrResetting: it never reached the
// driver.
func (g *gate) enter(ctx context.Context, op string) error {
	for {
		g.mu.Lock()
		if !g.closed {
			g.readers++
			g.mu.Unlock()
			return nil
		}
		ch, who := g.open, g.gpu
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("NVML %s: %w (GPU %s): %w", op, gpu.ErrResetting, who, ctx.Err())
		}
	}
}

func (g *gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.readers--
	if g.readers == 0 && g.drained != nil {
		close(g.drained)
		g.drained = nil
	}
}

// close takes the session for the reset of GPU id: it waits for another
// GPU's reset to end, then for the calls in flight. It is done when it
// returns nil; on an error the gate is as it was. Closing again for the
// same GPU is a no-op once the calls in flight have left: until then it
// waits for them too (a second release must not shut NVML down under
// them).
func (g *gate) close(ctx context.Context, id string) error {
	for {
		g.mu.Lock()
		if !g.closed {
			break
		}
		ch, who, drained := g.open, g.gpu, g.drained
		if who == id && drained == nil {
			g.mu.Unlock()
			return nil
		}
		g.mu.Unlock()
		if who != id {
			// Only another GPU's reset's end lets this one begin.
			drained = nil
		}
		select {
		case <-ch:
		case <-drained:
		case <-ctx.Done():
			if who == id {
				return fmt.Errorf("NVML calls in flight did not end: %w: %w", gpu.ErrTimeout, ctx.Err())
			}
			return fmt.Errorf("the reset of GPU %s holds the NVML session: %w: %w", who, gpu.ErrResetting, ctx.Err())
		}
	}
	g.closed, g.gpu, g.open = true, id, make(chan struct{})
	if g.readers == 0 {
		g.mu.Unlock()
		return nil
	}
	d, n := make(chan struct{}), g.readers
	g.drained = d
	g.mu.Unlock()
	select {
	case <-d:
		return nil
	case <-ctx.Done():
		g.reopen(false)
		return fmt.Errorf("NVML calls in flight (%d when the reset began) did not end: %w: %w", n, gpu.ErrTimeout, ctx.Err())
	}
}

// reopen lets calls in again; newSession says NVML was shut down and
// initialized again, so handles from before are invalid.
func (g *gate) reopen(newSession bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if newSession {
		g.gen++
	}
	g.closed, g.gpu, g.drained = false, "", nil
	if g.open != nil {
		close(g.open)
		g.open = nil
	}
}

// heldBy reports whether the reset of GPU id holds the session.
func (g *gate) heldBy(id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed && g.gpu == id
}

// wanted reports whether a reset holds or waits for the session: a
// long-lived caller (WatchEvents) lets go when it does.
func (g *gate) wanted() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// renew says NVML was initialized again outside a reset: handles from
// before are invalid.
func (g *gate) renew() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gen++
}

func (g *gate) generation() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.gen
}

// holdKey marks a context whose calls are inside the gate already: the
// calls of one operation share one entry, so that a reset cannot fall
// between a handle's lookup and its use.
type holdKey struct{}

// hold admits an operation of several calls. The returned context carries
// the entry (calls made with it do not enter again) and release must be
// called when the operation ends. Without a deadline, the wait is bounded
// by DefaultCallTimeout.
func (b *Backend) hold(ctx context.Context, op string) (context.Context, func(), error) {
	if ctx.Value(holdKey{}) == b {
		return ctx, func() {}, nil
	}
	wctx := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, DefaultCallTimeout)
		defer cancel()
	}
	if err := b.gate.enter(wctx, op); err != nil {
		return ctx, nil, err
	}
	hctx := context.WithValue(ctx, holdKey{}, b)
	if err := b.recoverSession(hctx, wctx); err != nil {
		b.gate.leave()
		return ctx, nil, fmt.Errorf("NVML %s: %w", op, err)
	}
	return hctx, b.gate.leave, nil
}
