// Package hostcall bounds calls into the host that cannot be interrupted
// (the NVIDIA driver through NVML, writes into sysfs). The caller gets its
// answer at its deadline while the call runs on in its own goroutine; a
// Tracker counts such abandoned calls until they return, so that an undo
// can wait for the host to quiesce (every abandoned call returned) before it reads what the host holds. A
// call abandoned at its deadline may still take effect, and undoing from
// a reading taken before it lands would leak the device it makes.
//
// The NVML backend (pkg/gpu/nvml) and the manager (pkg/manager, for sysfs)
// use it.
//
// Imports: nothing from vgpud.
package hostcall

import (
	"context"
	"sync"
)

// Tracker counts calls abandoned at their deadline that have not returned.
// The zero value is ready to use.
type Tracker struct {
	mu        sync.Mutex
	abandoned int
	waiters   []chan struct{}
}

// call is one call's fate, guarded by the Tracker's mutex.
type call struct {
	finished, abandoned bool
}

// Go runs fn and returns its result, or ctx's error when ctx ends first;
// fn then runs on and is counted by t until it returns.
func Go[T any](ctx context.Context, t *Tracker, fn func() T) (T, error) {
	c := &call{}
	out := make(chan T, 1)
	go func() {
		v := fn()
		t.mu.Lock()
		c.finished = true
		if c.abandoned {
			t.abandoned--
			if t.abandoned == 0 {
				for _, w := range t.waiters {
					close(w)
				}
				t.waiters = nil
			}
		}
		t.mu.Unlock()
		out <- v
	}()
	select {
	case v := <-out:
		return v, nil
	case <-ctx.Done():
	}
	t.mu.Lock()
	finished := c.finished
	if !finished {
		c.abandoned = true
		t.abandoned++
	}
	t.mu.Unlock()
	if finished {
		// It returned at the deadline: its answer is known, use it.
		return <-out, nil
	}
	var zero T
	return zero, ctx.Err()
}

// Abandoned is how many abandoned calls are still running.
func (t *Tracker) Abandoned() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.abandoned
}

// Quiesce waits until no abandoned call is running, or ctx ends.
func (t *Tracker) Quiesce(ctx context.Context) error {
	t.mu.Lock()
	if t.abandoned == 0 {
		t.mu.Unlock()
		return nil
	}
	w := make(chan struct{})
	t.waiters = append(t.waiters, w)
	t.mu.Unlock()
	select {
	case <-w:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
