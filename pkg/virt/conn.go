package virt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/vgpud/vgpud/internal/hostcall"
)

// Defaults for Config fields left zero.
const (
	DefaultURI           = "qemu:///system"
	DefaultSocket        = "/run/libvirt/libvirt-sock"
	DefaultDialTimeout   = 5 * time.Second
	DefaultCallTimeout   = 30 * time.Second
	DefaultDetachTimeout = 15 * time.Second
	DefaultReconnectWait = 5 * time.Second
	defaultMinBackoff    = 50 * time.Millisecond
	defaultMaxBackoff    = 5 * time.Second
)

// Config says where libvirtd is and how long to wait for it.
type Config struct {
	// URI is the libvirt connection URI sent to libvirtd (default
	// qemu:///system). Domain references qualified with a URI must name
	// this one.
	URI string
	// Socket is the unix socket of the daemon serving URI: a path, or
	// AutoSocket (also when empty) to find it as libvirt's clients do
	// (socket.go).
	Socket string
	// SocketDir is where AutoSocket looks (default DefaultSocketDir).
	SocketDir string
	// DialTimeout bounds one connection attempt: dial and handshake.
	DialTimeout time.Duration
	// CallTimeout bounds each method call, including the wait for a
	// connection while libvirtd restarts.
	CallTimeout time.Duration
	// DetachTimeout bounds the wait for libvirt's device-removed event after
	// a live detach (the guest has to let go of the device); it is also
	// bounded by CallTimeout.
	DetachTimeout time.Duration
	// ReconnectWait is how long after the connection broke a call still
	// waits for it to come back (libvirtd restarting takes a second or
	// two). Once libvirtd has been gone for longer, calls are refused at
	// once with ErrUnreachable instead of waiting out the caller's timeout;
	// the supervisor keeps redialling meanwhile.
	ReconnectWait time.Duration
	// MinBackoff and MaxBackoff bound the pause between reconnect attempts
	// (defaults 50 ms, 5 s); it doubles after each failure.
	MinBackoff, MaxBackoff time.Duration
	// Logger receives connection events (lost, restored) and retries.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.URI == "" {
		c.URI = DefaultURI
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.DetachTimeout <= 0 {
		c.DetachTimeout = DefaultDetachTimeout
	}
	if c.ReconnectWait <= 0 {
		c.ReconnectWait = DefaultReconnectWait
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = defaultMinBackoff
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = max(defaultMaxBackoff, c.MinBackoff)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Conn is a connection to libvirtd that reconnects by itself. When
// libvirtd goes away, a supervisor redials with backoff; calls made meanwhile
// wait for the new connection (up to their timeout, and no longer than
// ReconnectWait after the break), and an operation that a
// broken connection interrupted is repeated from the start on the new one.
// Every operation first reads what libvirt holds and only changes what is
// missing, so a repeat neither loses nor doubles a change. Safe for
// concurrent use.
type Conn struct {
	cfg   Config
	log   *slog.Logger
	hub   *hub
	locks keyedMutex
	// calls counts libvirt calls abandoned at their deadline (Quiesce).
	calls hostcall.Tracker

	mu      sync.Mutex
	cur     *session      // nil while disconnected
	changed chan struct{} // closed and replaced whenever cur changes
	lastErr error         // why the last connection attempt failed
	// downSince is when the connection broke; zero while connected.
	downSince time.Time

	life context.Context // cancelled by Close
	stop context.CancelFunc
	done chan struct{} // closed when the supervisor has exited
}

// session is one connection to libvirtd.
type session struct {
	l      *libvirt.Libvirt
	d      *dialer
	id     uint64
	killed atomic.Bool
}

func (s *session) alive() bool {
	if s.killed.Load() {
		return false
	}
	select {
	case <-s.l.Disconnected():
		return false
	default:
		return true
	}
}

// kill drops the connection at once, without asking libvirtd. The session
// counts as dead from here on, before go-libvirt has noticed the close.
func (s *session) kill() {
	s.killed.Store(true)
	s.d.close()
}

// dialer is a go-libvirt socket.Dialer that keeps the net.Conn, so a session
// can be dropped even when libvirtd stops answering.
type dialer struct {
	path    string
	timeout time.Duration

	mu     sync.Mutex
	conn   net.Conn
	closed bool
}

func (d *dialer) Dial() (net.Conn, error) {
	c, err := net.DialTimeout("unix", d.path, d.timeout)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	d.conn = c
	return c, nil
}

func (d *dialer) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	if d.conn != nil {
		d.conn.Close()
	}
}

// Connect opens a connection to libvirtd. It makes one attempt, bounded by
// DialTimeout and ctx, and returns ErrUnreachable if that fails; after that
// the Conn reconnects by itself until Close.
func Connect(ctx context.Context, cfg Config) (*Conn, error) {
	cfg = cfg.withDefaults()
	c := &Conn{
		cfg:     cfg,
		log:     cfg.Logger.With("uri", cfg.URI, "socket", cfg.where()),
		hub:     newHub(),
		changed: make(chan struct{}),
		done:    make(chan struct{}),
	}
	c.life, c.stop = context.WithCancel(context.Background())
	s, err := c.dial(ctx, 1)
	if err != nil {
		return nil, fmt.Errorf("connect to %s at %s: %w: %w", cfg.URI, cfg.where(), ErrUnreachable, err)
	}
	if err := c.subscribe(s); err != nil {
		s.kill()
		return nil, fmt.Errorf("connect to %s at %s: event registration: %w: %w", cfg.URI, s.d.path, ErrUnreachable, err)
	}
	c.publish(s, nil)
	go c.supervise(s)
	return c, nil
}

// URI is the libvirt URI this connection serves.
func (c *Conn) URI() string { return c.cfg.URI }

// Socket is the socket of the current connection ("" while there is
// none): with AutoSocket, the one the last connection attempt found.
func (c *Conn) Socket() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil {
		return ""
	}
	return c.cur.d.path
}

// Close disconnects and ends every Events channel. Calls after Close return
// ErrClosed.
func (c *Conn) Close() error {
	c.stop()
	<-c.done
	return nil
}

// dial makes one connection attempt, handshake included, within
// DialTimeout.
func (c *Conn) dial(ctx context.Context, id uint64) (*session, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	d := &dialer{path: c.cfg.SocketPath(), timeout: c.cfg.DialTimeout}
	l := libvirt.NewWithDialer(d)
	done := make(chan error, 1)
	go func() { done <- l.ConnectToURI(libvirt.ConnectURI(c.cfg.URI)) }()
	select {
	case err := <-done:
		if err != nil {
			d.close()
			return nil, libvirtErr(err)
		}
	case <-ctx.Done():
		// A socket that accepts but never answers (a hung libvirtd) ends
		// here; closing it ends the handshake goroutine too.
		d.close()
		return nil, fmt.Errorf("no answer from libvirtd: %w", ctx.Err())
	}
	return &session{l: l, d: d, id: id}, nil
}

// publish makes s (or nil) the current session and wakes waiters.
func (c *Conn) publish(s *session, lastErr error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cur = s
	c.lastErr = lastErr
	switch {
	case s != nil:
		c.downSince = time.Time{}
	case c.downSince.IsZero():
		c.downSince = time.Now()
	}
	close(c.changed)
	c.changed = make(chan struct{})
}

// supervise watches the session and replaces it when it breaks, until
// Close.
func (c *Conn) supervise(s *session) {
	defer close(c.done)
	defer c.hub.closeAll()
	for {
		select {
		case <-s.l.Disconnected():
			c.log.Warn("libvirtd connection lost; reconnecting")
			c.publish(nil, errors.New("connection lost"))
		case <-c.life.Done():
			c.publish(nil, ErrClosed)
			c.disconnect(s)
			return
		}
		s = c.redial(s.id + 1)
		if s == nil {
			return
		}
		c.log.Info("libvirtd connection restored")
		// Events of the gap are lost; tell subscribers so they re-read.
		c.hub.publish(Event{Kind: Reconnected})
	}
}

// redial connects with exponential backoff until it succeeds (the new
// session is published) or the Conn closes (nil).
func (c *Conn) redial(id uint64) *session {
	backoff := c.cfg.MinBackoff
	for attempt := 1; ; attempt++ {
		s, err := c.dial(c.life, id)
		if err == nil {
			err = c.subscribe(s)
			if err != nil {
				s.kill()
			}
		}
		if err == nil {
			c.publish(s, nil)
			return s
		}
		c.mu.Lock()
		c.lastErr = err
		c.mu.Unlock()
		c.log.Debug("reconnect failed", "attempt", attempt, "err", err, "retry_in", backoff)
		select {
		case <-c.life.Done():
			c.publish(nil, ErrClosed)
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, c.cfg.MaxBackoff)
	}
}

// disconnect says goodbye to libvirtd, but does not wait long for a hung
// one.
func (c *Conn) disconnect(s *session) {
	done := make(chan struct{})
	go func() {
		s.l.Disconnect()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(c.cfg.DialTimeout):
		s.kill()
	}
}

// session returns a connected session, waiting for the supervisor to
// reconnect if needed.
func (c *Conn) session(ctx context.Context) (*session, error) {
	for {
		c.mu.Lock()
		s, ch, lastErr, downSince := c.cur, c.changed, c.lastErr, c.downSince
		c.mu.Unlock()
		if s != nil && s.alive() {
			return s, nil
		}
		if c.life.Err() != nil {
			return nil, ErrClosed
		}
		if lastErr == nil {
			lastErr = errors.New("connection lost")
		}
		if downSince.IsZero() {
			// Broken, and the supervisor has not published it yet.
			downSince = time.Now()
		}
		wait := time.Until(downSince.Add(c.cfg.ReconnectWait))
		if wait <= 0 {
			return nil, fmt.Errorf("%w: %s: down for %s: %w", ErrUnreachable, c.cfg.where(), time.Since(downSince).Round(time.Second), lastErr)
		}
		t := time.NewTimer(wait)
		select {
		case <-ch:
		case <-t.C:
		case <-c.life.Done():
			t.Stop()
			return nil, ErrClosed
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w: %s: %w (%w)", ErrUnreachable, c.cfg.where(), lastErr, ctx.Err())
		}
		t.Stop()
	}
}

// do runs op within CallTimeout on a connected session. When the connection
// breaks under it, op is run again from the start on the next session; op
// must therefore read before it writes and skip what is already done.
func (c *Conn) do(ctx context.Context, name string, op func(r *rpc) error) error {
	return c.doTimeout(ctx, c.cfg.CallTimeout, name, op)
}

func (c *Conn) doTimeout(ctx context.Context, timeout time.Duration, name string, op func(r *rpc) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		s, err := c.session(ctx)
		if err != nil {
			return err
		}
		err = op(&rpc{ctx: ctx, s: s, c: c})
		if !isConnErr(err) {
			return err
		}
		if ctx.Err() != nil {
			return ctxErr(ctx)
		}
		c.log.Info("connection broke during operation; repeating it", "op", name, "err", err)
		// The supervisor may not have seen the break yet; make sure it does
		// instead of handing out the same session again.
		s.kill()
	}
}

// keyedMutex serializes work on one key (a hostdev, a domain) and lets
// other keys proceed.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyLock
}

type keyLock struct {
	mu    sync.Mutex
	users int
}

func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = make(map[string]*keyLock)
	}
	l := k.locks[key]
	if l == nil {
		l = &keyLock{}
		k.locks[key] = l
	}
	l.users++
	k.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		k.mu.Lock()
		if l.users--; l.users == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}
