package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/virt"
)

// lazyVirt is the libvirt connection the manager uses, made in the
// background: at boot vgpud is ordered before libvirtd (VMs must find their
// devices), so start-up must not wait for it. Calls made before the
// connection exists wait for it within their context; reconcile skips the
// attachment check until Ready.
type lazyVirt struct {
	cfg   virt.Config
	log   *slog.Logger
	ready chan struct{}

	mu   sync.Mutex
	conn *virt.Conn
}

var _ manager.Virt = (*lazyVirt)(nil)

func newLazyVirt(cfg virt.Config, log *slog.Logger) *lazyVirt {
	return &lazyVirt{cfg: cfg, log: log, ready: make(chan struct{})}
}

// try makes one connection attempt bounded by timeout.
func (l *lazyVirt) try(ctx context.Context, timeout time.Duration) error {
	if l.Ready() {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	c, err := virt.Connect(cctx, l.cfg)
	cancel()
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.conn = c
	l.mu.Unlock()
	close(l.ready)
	l.log.Info("connected to libvirt", "uri", l.cfg.URI, "socket", l.cfg.Socket)
	return nil
}

// connect dials until it succeeds or ctx ends, then calls onReady.
func (l *lazyVirt) connect(ctx context.Context, onReady func()) {
	delay := time.Second
	for attempt := 1; ; attempt++ {
		err := l.try(ctx, 10*time.Second)
		if err == nil {
			onReady()
			return
		}
		if attempt == 1 {
			l.log.Warn("libvirt not reachable yet; attach waits for it and vgpud keeps trying", "socket", l.cfg.Socket, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
}

// Ready reports whether the connection exists.
func (l *lazyVirt) Ready() bool {
	select {
	case <-l.ready:
		return true
	default:
		return false
	}
}

// get returns the connection. Before the first one exists a call waits
// no longer than the connection's ReconnectWait: at boot libvirtd starts
// a moment after vgpud, but a libvirtd that is not running at all is
// refused at once rather than at the caller's timeout.
func (l *lazyVirt) get(ctx context.Context) (*virt.Conn, error) {
	wait := l.cfg.ReconnectWait
	if wait <= 0 {
		wait = virt.DefaultReconnectWait
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-l.ready:
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.conn, nil
	case <-t.C:
		return nil, fmt.Errorf("connecting to libvirtd at %s: not connected yet (vgpud keeps trying): %w", l.cfg.Socket, virt.ErrUnreachable)
	case <-ctx.Done():
		return nil, fmt.Errorf("connecting to libvirtd at %s: %w", l.cfg.Socket, virt.ErrUnreachable)
	}
}

func (l *lazyVirt) URI() string { return l.cfg.URI }

func (l *lazyVirt) Domain(ctx context.Context, ref string) (virt.Domain, error) {
	c, err := l.get(ctx)
	if err != nil {
		return virt.Domain{}, err
	}
	return c.Domain(ctx, ref)
}

func (l *lazyVirt) Attach(ctx context.Context, domain string, h virt.Hostdev, instance string) (bool, error) {
	c, err := l.get(ctx)
	if err != nil {
		return false, err
	}
	return c.Attach(ctx, domain, h, instance)
}

func (l *lazyVirt) Detach(ctx context.Context, domain string, h virt.Hostdev, instance string) error {
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.Detach(ctx, domain, h, instance)
}

func (l *lazyVirt) Attached(ctx context.Context, ref string) ([]virt.Attached, error) {
	c, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return c.Attached(ctx, ref)
}

func (l *lazyVirt) Domains(ctx context.Context) ([]virt.Domain, error) {
	c, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return c.Domains(ctx)
}

// Settle: with no connection yet no call can be in flight.
func (l *lazyVirt) Settle(ctx context.Context) error {
	if !l.Ready() {
		return nil
	}
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.Settle(ctx)
}

// Events waits for the connection, then forwards its events.
func (l *lazyVirt) Events(ctx context.Context) <-chan virt.Event {
	out := make(chan virt.Event)
	go func() {
		defer close(out)
		// Events wait for the first connection as long as it takes.
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

func (l *lazyVirt) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		l.conn.Close()
	}
}
