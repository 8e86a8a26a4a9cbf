package virt

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
)

// EventKind is what happened to a domain.
type EventKind int

const (
	// Defined: a domain was defined, or its persistent config changed
	// (attach --config included).
	Defined EventKind = iota + 1
	// Undefined: a domain's persistent config was removed.
	Undefined
	// Started: a domain began to run.
	Started
	// Stopped: a domain stopped running (shut down, destroyed, crashed).
	Stopped
	// DeviceRemoved: the guest released a device after a live detach; Alias
	// names it.
	DeviceRemoved
	// DeviceRemovalFailed: the guest refused to release a device; Alias
	// names it.
	DeviceRemovalFailed
	// Reconnected: the connection to libvirtd was lost and is back. Events
	// of the gap are lost, so a subscriber should re-read what it cares
	// about. Domain and UUID are empty.
	Reconnected
)

func (k EventKind) String() string {
	switch k {
	case Defined:
		return "defined"
	case Undefined:
		return "undefined"
	case Started:
		return "started"
	case Stopped:
		return "stopped"
	case DeviceRemoved:
		return "device-removed"
	case DeviceRemovalFailed:
		return "device-removal-failed"
	case Reconnected:
		return "reconnected"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// Event is one libvirt domain event.
type Event struct {
	Kind   EventKind
	Domain string // name
	UUID   string
	Alias  string // device alias, for DeviceRemoved and DeviceRemovalFailed
}

// Events returns a channel of domain events that stays open across
// reconnects (a Reconnected event marks each one) until ctx ends or the Conn
// closes. Events queue without bound, so a slow reader delays nothing else,
// but it should keep reading.
func (c *Conn) Events(ctx context.Context) <-chan Event {
	return c.hub.add(ctx).out
}

// subscribe registers this package's event callbacks on a new session and
// forwards what arrives to the hub until the session ends.
func (c *Conn) subscribe(s *session) error {
	ctx, cancel := context.WithTimeout(c.life, c.cfg.DialTimeout)
	defer cancel()
	r := &rpc{ctx: ctx, s: s, c: c}
	for _, id := range []libvirt.DomainEventID{
		libvirt.DomainEventIDLifecycle,
		libvirt.DomainEventIDDeviceRemoved,
		libvirt.DomainEventIDDeviceRemovalFailed,
	} {
		// The stream lives as long as the session: go-libvirt closes it when
		// the connection drops.
		ch, err := call(r, func(l *libvirt.Libvirt) (<-chan any, error) {
			return l.SubscribeEvents(context.Background(), id, nil)
		})
		if err != nil {
			return fmt.Errorf("subscribe to event %d: %w", id, err)
		}
		go c.forward(ch)
	}
	return nil
}

func (c *Conn) forward(ch <-chan any) {
	for raw := range ch {
		if e, ok := convertEvent(raw); ok {
			c.hub.publish(e)
		}
	}
}

func convertEvent(raw any) (Event, bool) {
	dom := func(d libvirt.Domain) (string, string) { return d.Name, uuid.UUID(d.UUID).String() }
	switch m := raw.(type) {
	case *libvirt.DomainEventCallbackLifecycleMsg:
		var k EventKind
		switch libvirt.DomainEventType(m.Msg.Event) {
		case libvirt.DomainEventDefined:
			k = Defined
		case libvirt.DomainEventUndefined:
			k = Undefined
		case libvirt.DomainEventStarted:
			k = Started
		case libvirt.DomainEventStopped:
			k = Stopped
		default:
			return Event{}, false
		}
		name, id := dom(m.Msg.Dom)
		return Event{Kind: k, Domain: name, UUID: id}, true
	case *libvirt.DomainEventCallbackDeviceRemovedMsg:
		name, id := dom(m.Msg.Dom)
		return Event{Kind: DeviceRemoved, Domain: name, UUID: id, Alias: m.Msg.DevAlias}, true
	case *libvirt.DomainEventCallbackDeviceRemovalFailedMsg:
		name, id := dom(m.Dom)
		return Event{Kind: DeviceRemovalFailed, Domain: name, UUID: id, Alias: m.DevAlias}, true
	}
	return Event{}, false
}

// hub fans events out to subscribers, each with its own unbounded queue.
type hub struct {
	mu     sync.Mutex
	subs   map[*sub]struct{}
	closed bool
}

type sub struct {
	out  chan Event
	wake chan struct{} // one pending wake-up
	stop chan struct{} // closed when the hub closes

	mu sync.Mutex
	q  []Event
}

func newHub() *hub { return &hub{subs: make(map[*sub]struct{})} }

func (h *hub) add(ctx context.Context) *sub {
	s := &sub{out: make(chan Event), wake: make(chan struct{}, 1), stop: make(chan struct{})}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		close(s.out)
		return s
	}
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	go func() {
		defer close(s.out)
		defer h.remove(s)
		for {
			s.mu.Lock()
			if len(s.q) == 0 {
				s.mu.Unlock()
				select {
				case <-s.wake:
					continue
				case <-ctx.Done():
					return
				case <-s.stop:
					return
				}
			}
			e := s.q[0]
			s.mu.Unlock()
			select {
			case s.out <- e:
				s.mu.Lock()
				s.q = s.q[1:]
				s.mu.Unlock()
			case <-ctx.Done():
				return
			case <-s.stop:
				return
			}
		}
	}()
	return s
}

func (h *hub) remove(s *sub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, s)
}

func (h *hub) publish(e Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		s.mu.Lock()
		s.q = append(s.q, e)
		s.mu.Unlock()
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

func (h *hub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for s := range h.subs {
		close(s.stop)
		delete(h.subs, s)
	}
}
