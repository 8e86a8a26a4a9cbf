package uevent

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// FetchFunc returns the events numbered after after, oldest first, and the
// newest number the producer has issued. Numbers increase by one per
// event; a producer that keeps only a bounded history returns what it still
// has. An after beyond the newest number returns no events.
type FetchFunc func(after uint64) (events []Event, newest uint64, err error)

// DefaultPollInterval is how often a Poller asks its producer when it has
// nothing queued and the producer cannot say when it has news.
const DefaultPollInterval = 250 * time.Millisecond

// WakeFallback is how often a waking poller (NewWakingPoller) asks its
// producer unwoken, in case a change went unannounced.
const WakeFallback = 500 * time.Millisecond

// WakeFunc returns a channel that is closed at the producer's next change.
type WakeFunc func() <-chan struct{}

// Poller is a Source over a FetchFunc: the simulated host's uevent ring.
type Poller struct {
	fetch    FetchFunc
	wake     WakeFunc
	interval time.Duration

	mu      sync.Mutex
	last    uint64
	pending []Event
	closed  bool
	done    chan struct{}
}

var _ Source = (*Poller)(nil)

// NewPoller starts at the producer's newest event: what happened before
// is not replayed, as a netlink socket only sees what the kernel sends
// after it is bound. interval 0 means DefaultPollInterval.
func NewPoller(fetch FetchFunc, interval time.Duration) (*Poller, error) {
	if interval <= 0 {
		interval = DefaultPollInterval
	}
	_, newest, err := fetch(math.MaxUint64)
	if err != nil {
		return nil, fmt.Errorf("read uevents: %w", err)
	}
	return &Poller{fetch: fetch, interval: interval, last: newest, done: make(chan struct{})}, nil
}

// NewWakingPoller is NewPoller over a producer that says when it changes
// (the simulated host: sim.Host.Changed). The poller sleeps until woken,
// as a netlink reader sleeps until the kernel sends, and asks the
// producer every WakeFallback besides.
func NewWakingPoller(fetch FetchFunc, wake WakeFunc) (*Poller, error) {
	p, err := NewPoller(fetch, WakeFallback)
	if err != nil {
		return nil, err
	}
	p.wake = wake
	return p, nil
}

// Next returns the next event. A gap in the numbers (the producer's ring
// wrapped before the poller read it) is reported once as ErrOverflow and
// the events after the gap follow. A producer that starts over (its newest
// number went back) is reported as ErrOverflow too and followed from its
// new newest event.
func (p *Poller) Next(ctx context.Context) (Event, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.closed {
			return Event{}, ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return Event{}, err
		}
		if len(p.pending) > 0 {
			ev := p.pending[0]
			p.pending = p.pending[1:]
			return ev, nil
		}
		// Taken before the fetch: a change after it closes this channel.
		var woken <-chan struct{}
		if p.wake != nil {
			woken = p.wake()
		}
		evs, newest, err := p.fetch(p.last)
		if err != nil {
			return Event{}, fmt.Errorf("read uevents: %w", err)
		}
		if newest < p.last {
			// The producer started over (a new simulated host): what it
			// holds now is unknown to the caller.
			p.last = newest
			return Event{}, ErrOverflow
		}
		if len(evs) > 0 {
			gap := evs[0].Seq > p.last+1
			p.last = evs[len(evs)-1].Seq
			p.pending = evs
			if gap {
				return Event{}, ErrOverflow
			}
			continue
		}
		p.mu.Unlock()
		t := time.NewTimer(p.interval)
		select {
		case <-ctx.Done():
		case <-p.done:
		case <-t.C:
		case <-woken:
		}
		t.Stop()
		p.mu.Lock()
	}
}

// Close ends the poller; a blocked Next returns ErrClosed.
func (p *Poller) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		close(p.done)
	}
	return nil
}
