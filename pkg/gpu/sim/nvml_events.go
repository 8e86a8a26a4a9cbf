package sim

import (
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// supportedEvents is what the simulated GPUs report from GetSupportedEventTypes.
const supportedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError |
	nvml.EventTypeSingleBitEccError | nvml.EventTypeClock | nvml.EventMigConfigChange | nvml.EventTypePState

// eventSet is a simulated nvml.EventSet over the host's event ring.
type eventSet struct {
	*mock.EventSet
	l *lib

	mu   sync.Mutex
	regs map[string]uint64 // GPU UUID -> event mask
	last uint64            // last delivered sequence number
	free bool
	// scanned is state.json's stamp at the last full scan.
	scanned fileStamp
}

var _ nvml.EventSet = (*eventSet)(nil)

func (d *device) GetSupportedEventTypes() (uint64, nvml.Return) {
	var m uint64
	ret := d.read("GetSupportedEventTypes", func(*state, *gpuState) nvml.Return { m = supportedEvents; return nvml.SUCCESS })
	return m, ret
}

// RegisterEvents: masks with unsupported bits are NOT_SUPPORTED, as on a
// real GPU.
func (d *device) RegisterEvents(mask uint64, set nvml.EventSet) nvml.Return {
	es, ok := set.(*eventSet)
	if !ok || es.l.h != d.h {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	var uuid string
	var next uint64
	ret := d.read("RegisterEvents", func(st *state, g *gpuState) nvml.Return {
		if mask&^supportedEvents != 0 {
			return nvml.ERROR_NOT_SUPPORTED
		}
		uuid, next = g.UUID, st.NextEvent
		return nvml.SUCCESS
	})
	if ret != nvml.SUCCESS {
		return ret
	}
	es.mu.Lock()
	defer es.mu.Unlock()
	if len(es.regs) == 0 || next < es.last {
		es.last = next
	}
	es.regs[uuid] |= mask
	return nvml.SUCCESS
}

// Wait returns the next registered event, or TIMEOUT after timeoutMs. It
// blocks, as the driver's does, until the host's state changes (events
// arrive only with a change, by this process or another: Host.Changed)
// or the timeout ends; it does not poll.
func (es *eventSet) Wait(timeoutMs uint32) (nvml.EventData, nvml.Return) {
	timeout := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer timeout.Stop()
	for {
		changed := es.l.h.Changed()
		ev, ok, ret := es.next()
		if ret != nvml.SUCCESS {
			return nvml.EventData{}, ret
		}
		if ok {
			return ev, nvml.SUCCESS
		}
		select {
		case <-changed:
		case <-timeout.C:
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		}
	}
}

func (es *eventSet) next() (nvml.EventData, bool, nvml.Return) {
	es.mu.Lock()
	if es.free {
		es.mu.Unlock()
		return nvml.EventData{}, false, nvml.ERROR_INVALID_ARGUMENT
	}
	regs := make(map[string]uint64, len(es.regs))
	for k, v := range es.regs {
		regs[k] = v
	}
	last := es.last
	scanned := es.scanned
	es.mu.Unlock()
	// Events arrive only with a mutation, which rewrites state.json.
	stamp, err := es.l.h.committed()
	if err == nil && stamp.same(scanned) {
		return nvml.EventData{}, false, nvml.SUCCESS
	}

	var out nvml.EventData
	found := false
	var seq uint64
	var idx int
	ret := es.l.h.call("EventSetWait", -1, false, func(st *state, _ *gpuState) (bool, nvml.Return) {
		for _, e := range st.Events {
			if e.Seq <= last {
				continue
			}
			seq = e.Seq
			if regs[e.GPU]&e.Type == 0 {
				continue
			}
			for i, g := range st.GPUs {
				if g.UUID == e.GPU {
					idx = i
				}
			}
			out = nvml.EventData{EventType: e.Type, EventData: e.Data, GpuInstanceId: e.GI, ComputeInstanceId: e.CI}
			found = true
			return false, nvml.SUCCESS
		}
		return false, nvml.SUCCESS
	})
	if ret != nvml.SUCCESS {
		return nvml.EventData{}, false, ret
	}
	es.mu.Lock()
	if seq > es.last {
		es.last = seq
	}
	if !found {
		// Nothing more to deliver from this version of the state.
		es.scanned = stamp
	}
	es.mu.Unlock()
	if found {
		out.Device = es.l.h.device(es.l, idx)
	}
	return out, found, nvml.SUCCESS
}

func (es *eventSet) Free() nvml.Return {
	if ret := es.l.h.call("EventSetFree", -1, false, func(*state, *gpuState) (bool, nvml.Return) { return false, nvml.SUCCESS }); ret != nvml.SUCCESS {
		return ret
	}
	es.mu.Lock()
	defer es.mu.Unlock()
	es.free = true
	return nvml.SUCCESS
}
