// Package forward carries the manager's events to the metrics and the
// share loop: each event is counted in the collector (XIDs, lost GPUs,
// drift, operations and their durations), the share loop's cached
// inventory is dropped when an event changed it, and a VM's change lets
// the loop retry a pending policy switch at once. It stands apart from
// pkg/metrics, which knows nothing of the manager, so the metrics stay a
// view below it (docs/architecture.md, "Layers").
//
// Imports: pkg/manager, pkg/metrics.
package forward

import (
	"context"
	"log/slog"
	"strconv"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/metrics"
)

// Kicker is the share loop (*share.Loop): Kick makes it retry a pending
// policy switch now.
type Kicker interface{ Kick() }

// Invalidator is the share loop's cached inventory (*share.Cache).
type Invalidator interface{ Invalidate() }

// Events counts the manager's events in col (nil: no metrics endpoint),
// drops inv's cached inventory when an event changed what it holds, and
// lets the share loop retry a pending policy switch as soon as a VM
// changes state. It returns when ctx ends or events is closed.
func Events(ctx context.Context, events <-chan manager.Event, col *metrics.Collector, loop Kicker, inv Invalidator, log *slog.Logger) {
	for {
		var e manager.Event
		var ok bool
		select {
		case <-ctx.Done():
			return
		case e, ok = <-events:
			if !ok {
				return
			}
		}
		switch e.Kind {
		case manager.EventVM:
			loop.Kick()
		case manager.EventInstanceAdded, manager.EventInstanceChanged, manager.EventInstanceRemoved,
			manager.EventTenantAdded, manager.EventTenantChanged, manager.EventTenantRemoved, manager.EventGPUChanged, manager.EventGPULost:
			inv.Invalidate()
		}
		if col == nil {
			continue
		}
		switch e.Kind {
		case manager.EventXID:
			code, err := strconv.ParseUint(e.Detail, 10, 64)
			if err != nil {
				log.Debug("XID event without a number", "detail", e.Detail)
				continue
			}
			col.Observe(metrics.Event{Kind: metrics.EventXID, GPU: e.ID, XID: code})
		case manager.EventGPULost:
			col.Observe(metrics.Event{Kind: metrics.EventGPULost, GPU: e.ID})
		case manager.EventDrift:
			col.Observe(metrics.Event{Kind: metrics.EventDrift, Op: e.Op})
			if e.Op == manager.DriftSettings {
				col.Observe(metrics.Event{Kind: metrics.EventSettingRestored, Op: e.Setting, Cause: e.Cause})
			}
		case manager.EventOperationDone, manager.EventOperationFailed:
			col.Observe(metrics.Event{Kind: metrics.EventOperation, Op: e.Op, OK: e.Kind == manager.EventOperationDone, Duration: e.Took})
		}
	}
}
