package metrics

import (
	"context"
	"log/slog"
	"strconv"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/manager"
)

// Kicker is the share loop (*share.Loop): Kick makes it retry a pending
// policy switch now.
type Kicker interface{ Kick() }

// Invalidator is the share loop's cached inventory (*share.Cache).
type Invalidator interface{ Invalidate() }

// Forward counts the manager's events in col (nil: no metrics endpoint),
// drops inv's cached inventory when an event changed what it holds, and
// lets the share loop retry a pending policy switch as soon as a VM
// changes state. It returns when ctx ends or events is closed.
func Forward(ctx context.Context, events <-chan manager.Event, col *Collector, loop Kicker, inv Invalidator, log *slog.Logger) {
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
			col.Observe(Event{Kind: EventXID, GPU: e.ID, XID: code})
		case manager.EventGPULost:
			col.Observe(Event{Kind: EventGPULost, GPU: e.ID})
		case manager.EventDrift:
			col.Observe(Event{Kind: EventDrift, Op: e.Op})
		case manager.EventOperationDone, manager.EventOperationFailed:
			col.Observe(Event{Kind: EventOperation, Op: e.Op, OK: e.Kind == manager.EventOperationDone, Duration: e.Took})
		}
	}
}

// ReturnCode is an NVML return code as a metric label ("" for success),
// for ObserveNVML.
func ReturnCode(ret gonvml.Return) string {
	switch ret {
	case gonvml.SUCCESS:
		return ""
	case gonvml.ERROR_NOT_SUPPORTED:
		return "not_supported"
	case gonvml.ERROR_INVALID_ARGUMENT:
		return "invalid_argument"
	case gonvml.ERROR_NOT_FOUND:
		return "not_found"
	case gonvml.ERROR_GPU_IS_LOST:
		return "gpu_is_lost"
	case gonvml.ERROR_TIMEOUT:
		return "timeout"
	case gonvml.ERROR_IN_USE:
		return "in_use"
	case gonvml.ERROR_INSUFFICIENT_RESOURCES:
		return "insufficient_resources"
	case gonvml.ERROR_UNINITIALIZED:
		return "uninitialized"
	case gonvml.ERROR_NO_PERMISSION:
		return "no_permission"
	case gonvml.ERROR_RESET_REQUIRED:
		return "reset_required"
	case gonvml.ERROR_LIBRARY_NOT_FOUND, gonvml.ERROR_DRIVER_NOT_LOADED:
		return "driver_not_loaded"
	case gonvml.ERROR_ARGUMENT_VERSION_MISMATCH:
		return "argument_version_mismatch"
	case gonvml.ERROR_UNKNOWN:
		return "unknown"
	}
	return "code_" + strconv.Itoa(int(ret))
}
