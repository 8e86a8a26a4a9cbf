package manager

import (
	"sync"
	"time"
)

// EventKind names what happened.
type EventKind string

const (
	EventInstanceAdded   EventKind = "InstanceAdded"
	EventInstanceChanged EventKind = "InstanceChanged"
	EventInstanceRemoved EventKind = "InstanceRemoved"
	EventTenantAdded     EventKind = "TenantAdded"
	EventTenantChanged   EventKind = "TenantChanged"
	EventTenantRemoved   EventKind = "TenantRemoved"
	EventGPUChanged      EventKind = "GPUChanged"
	EventGPULost         EventKind = "GPULost"
	EventOperationDone   EventKind = "OperationFinished"
	EventOperationFailed EventKind = "OperationFailed"
	EventVM              EventKind = "VMEvent"
	EventPolicySwitched  EventKind = "PolicySwitched"
	// EventXID is an NVML XID event; ID is the GPU UUID, Detail the XID number.
	EventXID EventKind = "XID"
)

// Event is one state change, for D-Bus signals and the log.
type Event struct {
	Kind EventKind
	// ID is the instance UUID, tenant name or GPU UUID the event is about.
	ID string
	// Op is the operation (create, destroy, attach, ...) for operation events.
	Op string
	// Detail is a one-line human description (error message for failures).
	Detail string
	Time   time.Time
	// Took is how long the operation ran, for operation events.
	Took time.Duration
	// Setting and Cause, for an EventDrift of op DriftSettings: the GPU
	// setting set again (SettingHeterogeneous, SettingScheduler) and the
	// pass that found it lost (CauseDrift, CauseReconcile).
	Setting, Cause string
}

// subscriberBuffer is how many events a slow subscriber may lag behind
// before it loses events (it is told by a Dropped count).
const subscriberBuffer = 1024

type broadcaster struct {
	mu   sync.Mutex
	subs map[chan Event]struct{}
	// Dropped counts events lost to slow subscribers.
	dropped uint64
}

func newBroadcaster() *broadcaster { return &broadcaster{subs: map[chan Event]struct{}{}} }

func (b *broadcaster) publish(e Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ch := range b.subs {
		select {
		case ch <- e:
		default:
			b.dropped++
		}
	}
}

// Subscribe returns a channel of events and a function that ends the
// subscription (and closes the channel).
func (m *Manager) Subscribe() (<-chan Event, func()) {
	ch := make(chan Event, subscriberBuffer)
	b := m.events
	b.mu.Lock()
	b.subs[ch] = struct{}{}
	b.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			b.mu.Lock()
			delete(b.subs, ch)
			close(ch)
			b.mu.Unlock()
		})
	}
}

// Publish lets other daemon parts (the share loop, fault handling) emit events.
func (m *Manager) Publish(e Event) { m.emit(e) }

func (m *Manager) emit(e Event) {
	if e.Time.IsZero() {
		e.Time = m.now()
	}
	m.events.publish(e)
}
