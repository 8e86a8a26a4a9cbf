package nvml

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// WatchedEvents are the NVML event types WatchEvents registers on each GPU
// that supports them: XIDs (the driver's error reports, XID 79 when a GPU
// falls off the bus), double-bit ECC errors, the GPU becoming unavailable,
// and MIG reconfiguration by another NVML client.
const WatchedEvents = gonvml.EventTypeXidCriticalError | gonvml.EventTypeDoubleBitEccError |
	gonvml.EventTypeGpuUnavailableError | gonvml.EventMigConfigChange

// eventWait bounds one EventSet.Wait: how long WatchEvents takes to notice
// that its context ended.
const eventWait = 500 * time.Millisecond

// maxWaitFailures is how many Wait errors in a row end WatchEvents (the
// caller starts it again, with a fresh event set).
const maxWaitFailures = 10

// Event is one NVML event.
type Event struct {
	// GPU and PCI identify the GPU. Both are "" when NVML could not say
	// which GPU it was: a GPU that fell off the bus answers no queries, so
	// the handle its XID 79 arrives with cannot be resolved unless it is
	// the only registered GPU that is now lost.
	GPU string
	PCI string
	// Type is the NVML event type bit (gonvml.EventTypeXidCriticalError, ...).
	Type uint64
	// XID is the XID number of an XID event (999: an XID the driver does
	// not name); 0 for other types.
	XID uint64
	// GPUInstance and ComputeInstance scope the event to a MIG instance;
	// -1 when it is not attributable to one.
	GPUInstance, ComputeInstance int
	// Lost: Wait returned GPU_IS_LOST with the event.
	Lost bool
	Time time.Time
}

// IsXID reports whether the event is an XID error report.
func (e Event) IsXID() bool { return e.Type&gonvml.EventTypeXidCriticalError != 0 }

// registered is one GPU in the event set.
type registered struct {
	dev       gonvml.Device
	uuid, pci string
}

// WatchEvents registers WatchedEvents on every GPU that supports them and
// calls fn for each event until ctx ends, then frees the event set and
// returns nil. fn runs on WatchEvents' goroutine and must not block for
// long. A GPU that supports none of the types is skipped; one that is
// lost when WatchEvents starts is reported once as an Event with Lost set
// and no GPU (it cannot be asked which it is), then skipped: call
// WatchEvents again after it is back to follow it. A GPU reset (Backend.ReleaseSession) ends
// it with gpu.ErrResetting. Errors: gpu.ErrDriverNotLoaded when NVML is not initialized or the
// driver went away; gpu.ErrNotSupported when no GPU could be registered;
// a Wait that keeps failing ends it with the last NVML return code.
func (b *Backend) WatchEvents(ctx context.Context, fn func(Event)) error {
	// The event set lives in the session: it is freed, and the gate left,
	// when a GPU reset wants the session (gpu.ErrResetting; the caller
	// starts again, and waits for the new session).
	ctx, release, err := b.hold(ctx, "WatchEvents")
	if err != nil {
		return fmt.Errorf("watch NVML events: %w", err)
	}
	defer release()
	set, err := call(ctx, b, "EventSetCreate", b.lib.EventSetCreate)
	if err != nil {
		return fmt.Errorf("create NVML event set: %w", err)
	}
	defer func() { _ = set.Free() }()
	regs, lost, err := b.registerEvents(ctx, set)
	if err != nil {
		return err
	}
	// A GPU that fell off the bus before it could be registered sends no
	// XID any more: say so, or it would go unnoticed.
	for i := 0; i < lost; i++ {
		fn(Event{Lost: true, GPUInstance: -1, ComputeInstance: -1, Time: time.Now()})
	}
	if len(regs) == 0 {
		return fmt.Errorf("watch NVML events: no GPU can report events: %w", gpu.ErrNotSupported)
	}
	b.log.Debug("watching NVML events", "gpus", len(regs))
	fails := 0
	lostSeen := map[string]bool{}
	for {
		if ctx.Err() != nil {
			return nil
		}
		if b.gate.wanted() {
			return fmt.Errorf("watch NVML events: the event set is freed for a GPU reset: %w", gpu.ErrResetting)
		}
		data, ret := set.Wait(uint32(eventWait / time.Millisecond))
		switch ret {
		case gonvml.ERROR_TIMEOUT:
			fails = 0
			continue
		case gonvml.SUCCESS:
			fails = 0
			fn(b.event(regs, data, false))
			continue
		case gonvml.ERROR_GPU_IS_LOST:
			// Reported once per GPU; a driver that keeps answering
			// GPU_IS_LOST is a failing Wait from then on.
			ev := b.event(regs, data, true)
			if !lostSeen[ev.GPU] {
				lostSeen[ev.GPU] = true
				fails = 0
				fn(ev)
				continue
			}
		case gonvml.ERROR_UNINITIALIZED, gonvml.ERROR_DRIVER_NOT_LOADED, gonvml.ERROR_LIBRARY_NOT_FOUND:
			return fmt.Errorf("wait for NVML events: %w", wrap(ret))
		}
		fails++
		if fails >= maxWaitFailures {
			return fmt.Errorf("wait for NVML events: %d failures in a row: %w", fails, wrap(ret))
		}
		b.log.Warn("NVML event wait failed", "ret", ret, "attempt", fails)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// registerEvents adds every GPU that supports some of WatchedEvents to
// set, and counts the GPUs that are lost.
func (b *Backend) registerEvents(ctx context.Context, set gonvml.EventSet) (regs []registered, lost int, err error) {
	n, err := call(ctx, b, "DeviceGetCount", b.lib.DeviceGetCount)
	if err != nil {
		return nil, 0, fmt.Errorf("watch NVML events: count GPUs: %w", err)
	}
	for i := 0; i < n; i++ {
		d, err := call(ctx, b, "DeviceGetHandleByIndex", func() (gonvml.Device, gonvml.Return) { return b.lib.DeviceGetHandleByIndex(i) })
		if err != nil {
			if errors.Is(err, gpu.ErrGPULost) {
				lost++
			}
			b.log.Warn("no events from GPU", "index", i, "err", err)
			continue
		}
		r := registered{dev: d}
		if r.uuid, err = call(ctx, b, "GetUUID", d.GetUUID); err != nil {
			if ctx.Err() != nil {
				return nil, 0, ctx.Err()
			}
			if errors.Is(err, gpu.ErrGPULost) {
				lost++
			}
			b.log.Warn("no events from GPU", "index", i, "err", err)
			continue
		}
		if pci, err := call(ctx, b, "GetPciInfo", d.GetPciInfo); err == nil {
			r.pci, _ = gpu.NormalizePCI(cString(pci.BusId[:]))
		}
		supported, err := call(ctx, b, "GetSupportedEventTypes", d.GetSupportedEventTypes)
		if err != nil || supported&WatchedEvents == 0 {
			if ctx.Err() != nil {
				return nil, 0, ctx.Err()
			}
			if errors.Is(err, gpu.ErrGPULost) {
				lost++
			}
			b.log.Warn("no events from GPU", "gpu", r.pci, "uuid", r.uuid, "supported", supported, "err", err)
			continue
		}
		mask := supported & WatchedEvents
		if err := b.do(ctx, "RegisterEvents", func() gonvml.Return { return d.RegisterEvents(mask, set) }); err != nil {
			if ctx.Err() != nil {
				return nil, 0, ctx.Err()
			}
			if errors.Is(err, gpu.ErrGPULost) {
				lost++
			}
			b.log.Warn("no events from GPU", "gpu", r.pci, "uuid", r.uuid, "err", err)
			continue
		}
		regs = append(regs, r)
	}
	return regs, lost, nil
}

// event converts an NVML event, resolving its device to a registered GPU.
func (b *Backend) event(regs []registered, data gonvml.EventData, lost bool) Event {
	ev := Event{Type: data.EventType, GPUInstance: scope(data.GpuInstanceId), ComputeInstance: scope(data.ComputeInstanceId),
		Lost: lost, Time: time.Now()}
	if ev.IsXID() {
		ev.XID = data.EventData
	}
	if r, ok := resolve(regs, data.Device); ok {
		ev.GPU, ev.PCI = r.uuid, r.pci
	}
	return ev
}

// resolve finds the registered GPU an event's handle belongs to: the same
// handle (the real library's handles compare equal), the UUID the handle
// reports, or, for a handle that answers nothing, the one registered GPU
// that is now lost.
func resolve(regs []registered, dev gonvml.Device) (registered, bool) {
	if dev == nil {
		return elimination(regs)
	}
	if reflect.TypeOf(dev).Comparable() {
		for _, r := range regs {
			if reflect.TypeOf(r.dev) == reflect.TypeOf(dev) && r.dev == dev {
				return r, true
			}
		}
	}
	if uuid, ret := dev.GetUUID(); ret == gonvml.SUCCESS {
		for _, r := range regs {
			if r.uuid == uuid {
				return r, true
			}
		}
		return registered{uuid: uuid}, true
	}
	return elimination(regs)
}

func elimination(regs []registered) (registered, bool) {
	var lost []registered
	for _, r := range regs {
		if _, ret := r.dev.GetUUID(); ret == gonvml.ERROR_GPU_IS_LOST {
			lost = append(lost, r)
		}
	}
	if len(lost) == 1 {
		return lost[0], true
	}
	return registered{}, false
}

// scope turns NVML's "not attributable" id (0xFFFFFFFF) into -1.
func scope(id uint32) int {
	if id == 0xFFFFFFFF {
		return -1
	}
	return int(id)
}
