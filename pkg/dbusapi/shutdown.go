package dbusapi

import (
	"context"
	"fmt"
	"time"
)

// replyWrite is how long CancelAll leaves the bus library, once the last
// cancelled operation has returned, to write its reply: the library writes
// it after the method returns, which is just after the operation left the
// tracker, and the connection must not close before.
const replyWrite = 100 * time.Millisecond

// CancelAll cancels every operation in flight, as Cancel does for one, and
// waits until each has returned, so that its caller has a reply (the named
// error of a cancelled operation; the manager goes on with the undo)
// before the daemon leaves the bus. It is for a daemon that stops when its
// grace for operations in flight is over: the manager refuses new
// operations by then (manager.Shutdown), and one that slips in meanwhile
// is cancelled too. why is logged. ctx bounds the wait; the error says how
// many operations had not returned by then. It returns how many were in
// flight when it was called.
func (s *Service) CancelAll(ctx context.Context, why string) (int, error) {
	n := s.ops.cancelAll()
	if n == 0 {
		return 0, nil
	}
	s.log.Warn("cancelling the operations in flight", "why", why, "operations", n)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for left := n; left > 0; left = s.ops.cancelAll() {
		select {
		case <-ctx.Done():
			return n, fmt.Errorf("%d operations had not returned after they were cancelled: %w", left, ctx.Err())
		case <-t.C:
		}
	}
	select {
	case <-ctx.Done():
	case <-time.After(replyWrite):
	}
	return n, nil
}

// cancelAll cancels every operation in flight and says how many there are;
// cancelling one twice does nothing more.
func (t *opTracker) cancelAll() int {
	t.mu.Lock()
	var list []*op
	for _, ops := range t.bySender {
		for o := range ops {
			list = append(list, o)
		}
	}
	t.mu.Unlock()
	for _, o := range list {
		o.stop()
	}
	return len(list)
}
