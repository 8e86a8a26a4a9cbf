package virt

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Pacing of Lazy.Connect: one attempt may take lazyAttempt, and the pause
// between attempts doubles from lazyMinBackoff to lazyMaxBackoff. Slower
// than a Conn's redial: a libvirtd that never answered may not be installed
// or enabled at all, and each failure costs a dial and a handshake.
const (
	lazyAttempt    = 10 * time.Second
	lazyMinBackoff = time.Second
	lazyMaxBackoff = 30 * time.Second
)

// Lazy is a Conn made in the background. At boot the daemon is ordered
// before libvirtd (VMs must find their devices), so its start-up cannot wait
// for libvirtd: it makes a Lazy, tries once (TryConnect), and leaves Connect
// to retry.
//
// Lazy has every method of Conn that the manager uses. Before the first
// connection exists a call waits for it no longer than the configuration's
// ReconnectWait, then fails with ErrUnreachable: at boot libvirtd starts a
// moment after the daemon, but one that is not running at all is refused at
// once rather than at the caller's timeout. Once connected, calls go to the
// Conn, which reconnects by itself. Safe for concurrent use.
type Lazy struct {
	cfg   Config
	log   *slog.Logger
	ready chan struct{} // closed once conn is set

	mu   sync.Mutex
	conn *Conn
}

// NewLazy returns a Lazy for cfg that is not connected yet.
func NewLazy(cfg Config) *Lazy {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Lazy{cfg: cfg, log: log, ready: make(chan struct{})}
}

// TryConnect makes one connection attempt, bounded by timeout and ctx. It
// returns nil at once when the connection exists, and the attempt's error
// (ErrUnreachable) when it fails.
func (l *Lazy) TryConnect(ctx context.Context, timeout time.Duration) error {
	if l.Ready() {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	c, err := Connect(cctx, l.cfg)
	cancel()
	if err != nil {
		return err
	}
	l.mu.Lock()
	if l.conn != nil {
		// Another attempt won meanwhile; keep its connection.
		l.mu.Unlock()
		return c.Close()
	}
	l.conn = c
	close(l.ready)
	l.mu.Unlock()
	l.log.Info("connected to libvirt", "uri", l.cfg.URI, "socket", c.Socket())
	return nil
}

// Connect tries to connect, with backoff, until it succeeds or ctx ends.
// Once connected (also when it already was) it calls onReady, then
// returns; when ctx ends first it returns without calling it.
func (l *Lazy) Connect(ctx context.Context, onReady func()) {
	delay := lazyMinBackoff
	for attempt := 1; ; attempt++ {
		err := l.TryConnect(ctx, lazyAttempt)
		if err == nil {
			onReady()
			return
		}
		if attempt == 1 {
			l.log.Warn("libvirt not reachable yet; attach waits for it and vgpud keeps trying", "socket", l.cfg.where(), "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, lazyMaxBackoff)
	}
}

// Ready reports whether the connection exists. The manager asks it before
// reading what libvirt holds, so that reconcile skips the attachment check
// instead of waiting for a libvirtd that is not there yet.
func (l *Lazy) Ready() bool {
	select {
	case <-l.ready:
		return true
	default:
		return false
	}
}

// get returns the connection, waiting for the first one no longer than
// ReconnectWait.
func (l *Lazy) get(ctx context.Context) (*Conn, error) {
	wait := l.cfg.ReconnectWait
	if wait <= 0 {
		wait = DefaultReconnectWait
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-l.ready:
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.conn, nil
	case <-t.C:
		return nil, fmt.Errorf("connecting to libvirtd at %s: not connected yet (vgpud keeps trying): %w", l.cfg.where(), ErrUnreachable)
	case <-ctx.Done():
		return nil, fmt.Errorf("connecting to libvirtd at %s: %w", l.cfg.where(), ErrUnreachable)
	}
}

// URI is the libvirt URI of the configuration, as given.
func (l *Lazy) URI() string { return l.cfg.URI }

// Domain is Conn.Domain once connected.
func (l *Lazy) Domain(ctx context.Context, ref string) (Domain, error) {
	c, err := l.get(ctx)
	if err != nil {
		return Domain{}, err
	}
	return c.Domain(ctx, ref)
}

// Attach is Conn.Attach once connected.
func (l *Lazy) Attach(ctx context.Context, domain string, h Hostdev, instance string) (bool, error) {
	c, err := l.get(ctx)
	if err != nil {
		return false, err
	}
	return c.Attach(ctx, domain, h, instance)
}

// Detach is Conn.Detach once connected.
func (l *Lazy) Detach(ctx context.Context, domain string, h Hostdev, instance string) error {
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.Detach(ctx, domain, h, instance)
}

// Attached is Conn.Attached once connected.
func (l *Lazy) Attached(ctx context.Context, ref string) ([]Attached, error) {
	c, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return c.Attached(ctx, ref)
}

// Domains is Conn.Domains once connected.
func (l *Lazy) Domains(ctx context.Context) ([]Domain, error) {
	c, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return c.Domains(ctx)
}

// Quiesce is Conn.Quiesce once connected. Before that it returns nil at once:
// with no connection yet no call can be in flight.
func (l *Lazy) Quiesce(ctx context.Context) error {
	if !l.Ready() {
		return nil
	}
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.Quiesce(ctx)
}

// Events is Conn.Events once connected. Unlike the calls, it waits for the
// first connection as long as ctx lives: a subscriber made at start-up
// must see the events of a libvirtd that comes up an hour later.
func (l *Lazy) Events(ctx context.Context) <-chan Event {
	out := make(chan Event)
	go func() {
		defer close(out)
		select {
		case <-l.ready:
		case <-ctx.Done():
			return
		}
		l.mu.Lock()
		c := l.conn
		l.mu.Unlock()
		for ev := range c.Events(ctx) {
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// Close closes the connection, if one was made. Cancel Connect's ctx
// first: a connection Connect makes after Close stays open.
func (l *Lazy) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		return l.conn.Close()
	}
	return nil
}
