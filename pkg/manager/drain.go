package manager

import (
	"context"
	"fmt"
)

// begin registers a mutating operation; it fails once Shutdown started,
// so a stopping daemon accepts no new work.
func (m *Manager) begin() (done func(), err error) {
	m.opsMu.Lock()
	defer m.opsMu.Unlock()
	if m.closing {
		return nil, fail(ErrBusy, nil, "vgpud is shutting down; retry when it is back")
	}
	m.ops.Add(1)
	return m.ops.Done, nil
}

// beginCarving is begin for an operation that changes the host: it is
// also refused while the manager is degraded (the driver never came).
func (m *Manager) beginCarving() (done func(), err error) {
	done, err = m.begin()
	if err != nil {
		return nil, err
	}
	if why := m.Degraded(); why != "" {
		done()
		return nil, fail(ErrBusy, nil, "carving is disabled: %s; reads still work", why)
	}
	return done, nil
}

// background runs fn (an undo that waits for the host) as an operation
// Shutdown waits for; the caller already holds one, so it cannot be late.
func (m *Manager) background(fn func()) {
	m.opsMu.Lock()
	m.ops.Add(1)
	m.opsMu.Unlock()
	go func() {
		defer m.ops.Done()
		fn()
	}()
}

// Shutdown refuses new operations and waits for those in flight, up to ctx.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.opsMu.Lock()
	m.closing = true
	m.opsMu.Unlock()
	idle := make(chan struct{})
	go func() { m.ops.Wait(); close(idle) }()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("operations still in flight at shutdown: %w", ctx.Err())
	}
}
