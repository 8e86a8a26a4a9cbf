package uevent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// ring is a producer that keeps the last size events, as the simulated
// host does.
type ring struct {
	mu     sync.Mutex
	size   int
	events []Event
	next   uint64
	fail   error
}

func (r *ring) emit(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := 0; i < n; i++ {
		r.next++
		r.events = append(r.events, Event{Action: Change, DevPath: fmt.Sprintf("/devices/x/%d", r.next), Subsystem: "pci", Seq: r.next})
	}
	if len(r.events) > r.size {
		r.events = r.events[len(r.events)-r.size:]
	}
}

func (r *ring) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events, r.next = nil, 0
}

func (r *ring) fetch(after uint64) ([]Event, uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return nil, 0, r.fail
	}
	var out []Event
	for _, e := range r.events {
		if e.Seq > after {
			out = append(out, e)
		}
	}
	return out, r.next, nil
}

// drain reads n results (events or errors) with a deadline.
func drain(t *testing.T, p *Poller, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []string
	for len(out) < n {
		ev, err := p.Next(ctx)
		switch {
		case errors.Is(err, ErrOverflow):
			out = append(out, "overflow")
		case err != nil:
			t.Fatalf("Next: %v (after %v)", err, out)
		default:
			out = append(out, fmt.Sprint(ev.Seq))
		}
	}
	return out
}

func TestPoller(t *testing.T) {
	tests := []struct {
		name string
		// before runs before NewPoller, after between NewPoller and reading.
		before, after func(r *ring)
		read          int
		want          []string
	}{
		{name: "history-not-replayed", before: func(r *ring) { r.emit(3) }, after: func(r *ring) { r.emit(2) }, read: 2, want: []string{"4", "5"}},
		{name: "ring-wrapped-between-polls", after: func(r *ring) { r.emit(10) }, read: 5, want: []string{"overflow", "7", "8", "9", "10"}},
		{name: "producer-started-over", before: func(r *ring) { r.emit(5) }, after: func(r *ring) { r.reset(); r.emit(2) },
			read: 1, want: []string{"overflow"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &ring{size: 4}
			if tt.before != nil {
				tt.before(r)
			}
			p, err := NewPoller(r.fetch, time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if tt.after != nil {
				tt.after(r)
			}
			got := drain(t, p, tt.read)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPollerWaitsForEvents(t *testing.T) {
	r := &ring{size: 16}
	p, err := NewPoller(r.fetch, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got := make(chan []string, 1)
	go func() { got <- drain(t, p, 1) }()
	r.emit(1)
	if g := <-got; fmt.Sprint(g) != "[1]" {
		t.Fatalf("got %v", g)
	}
}

func TestPollerContinuesAfterRestart(t *testing.T) {
	r := &ring{size: 16}
	r.emit(5)
	p, err := NewPoller(r.fetch, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	r.reset()
	r.emit(2)
	if got := drain(t, p, 1); fmt.Sprint(got) != "[overflow]" {
		t.Fatalf("after restart: %v", got)
	}
	r.emit(1)
	if got := drain(t, p, 1); fmt.Sprint(got) != "[3]" {
		t.Fatalf("next event: %v", got)
	}
}

func TestPollerStops(t *testing.T) {
	tests := []struct {
		name    string
		stop    func(p *Poller, cancel context.CancelFunc)
		wantErr error
	}{
		{name: "context", stop: func(_ *Poller, cancel context.CancelFunc) { cancel() }, wantErr: context.Canceled},
		{name: "close", stop: func(p *Poller, _ context.CancelFunc) { p.Close() }, wantErr: ErrClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &ring{size: 4}
			p, err := NewPoller(r.fetch, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { _, err := p.Next(ctx); done <- err }()
			tt.stop(p, cancel)
			select {
			case err := <-done:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Next: %v, want %v", err, tt.wantErr)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Next did not return")
			}
		})
	}
}

func TestPollerFetchError(t *testing.T) {
	boom := errors.New("state unreadable")
	if _, err := NewPoller((&ring{fail: boom}).fetch, 0); !errors.Is(err, boom) {
		t.Fatalf("NewPoller: %v, want %v", err, boom)
	}
	r := &ring{size: 4}
	p, err := NewPoller(r.fetch, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.fail = boom
	r.mu.Unlock()
	if _, err := p.Next(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("Next: %v, want %v", err, boom)
	}
}

// waker is a producer's change signal: a channel closed at each change.
type waker struct {
	mu sync.Mutex
	ch chan struct{}
}

func (w *waker) wait() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

func (w *waker) changed() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}

// A waking poller reads what the producer announces without waiting for
// its fallback poll (an hour here, so only the wake can deliver).
func TestWakingPoller(t *testing.T) {
	r := &ring{size: 8}
	w := &waker{}
	// empty says the poller found nothing and is about to sleep.
	empty := make(chan struct{}, 16)
	fetch := func(after uint64) ([]Event, uint64, error) {
		evs, newest, err := r.fetch(after)
		if len(evs) == 0 {
			empty <- struct{}{}
		}
		return evs, newest, err
	}
	p, err := NewWakingPoller(fetch, w.wait)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	<-empty // NewPoller's own read
	p.interval = time.Hour
	go func() {
		for i := 0; i < 3; i++ {
			<-empty
			r.emit(1)
			w.changed()
		}
	}()
	if evs := drain(t, p, 3); fmt.Sprint(evs) != "[1 2 3]" {
		t.Fatalf("events %v, want [1 2 3]", evs)
	}
}
