package dbusapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/vgpud/vgpud/pkg/manager"
)

// Options configure the service.
type Options struct {
	// Address is the bus address; "" is the system bus
	// ($DBUS_SYSTEM_BUS_ADDRESS, else /run/dbus/system_bus_socket).
	Address string
	Logger  *slog.Logger
	// Version is reported as the Manager's Version property.
	Version string
	// Group is the group whose members may read and change state
	// (default "vgpud").
	Group string
	// GroupReadOnly lets Group's members read but not change: their
	// changes, as anyone else's, need polkit's authorization (the
	// setting groupAccess: read).
	GroupReadOnly bool
	// NoPolkit never asks polkit (only root and Group may change state).
	NoPolkit bool
	// Shares feeds GetShares' achieved, demand and interference figures;
	// nil reports them unknown.
	Shares SharesSource
	// Fleet feeds GetFleetStatus; nil (or ErrNoFleet) answers Unavailable.
	Fleet FleetSource
	// Apply carries out declarative configuration; nil makes Apply fail
	// with BackendFailure.
	Apply Applier
	// ResyncInterval is how often the objects are compared with the
	// manager even without an event: a safety net, since every change the
	// manager makes or discovery finds is an event. Default 60s.
	ResyncInterval time.Duration
	// DefaultTimeout bounds a long operation whose caller gave no timeout
	// (default 5m); MaxTimeout caps what a caller may ask (default 1h).
	DefaultTimeout, MaxTimeout time.Duration

	// Test seams: who callers are and what polkit says (nil: ask the bus).
	credentials func(ctx context.Context, sender string) (Caller, error)
	polkit      func(ctx context.Context, sender string, interactive bool) (bool, error)
}

// Service is the dev.vgpud1 service on a bus connection.
type Service struct {
	m    *manager.Manager
	opts Options
	log  *slog.Logger
	conn *dbus.Conn

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// inFlight counts method calls being served, so Close lets each be
	// answered before the connection goes.
	inFlight atomic.Int64

	ifaces map[string]*ifaceDef

	syncMu sync.Mutex
	snapMu sync.RWMutex
	snap   *snapshot

	creds *credCache
	ops   *opTracker

	closeOnce sync.Once
	closeErr  error

	// credentials and polkit are the bus look-ups; tests replace them to
	// play callers other than the test's own uid.
	credentials func(ctx context.Context, sender string) (Caller, error)
	polkit      func(ctx context.Context, sender string, interactive bool) (bool, error)
}

func newService(m *manager.Manager, opts Options) *Service {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Group == "" {
		opts.Group = "vgpud"
	}
	if opts.ResyncInterval <= 0 {
		opts.ResyncInterval = time.Minute
	}
	if opts.DefaultTimeout <= 0 {
		opts.DefaultTimeout = 5 * time.Minute
	}
	if opts.MaxTimeout <= 0 {
		opts.MaxTimeout = time.Hour
	}
	s := &Service{m: m, opts: opts, log: opts.Logger, creds: newCredCache(), ops: newOpTracker()}
	s.credentials, s.polkit = opts.credentials, opts.polkit
	if s.credentials == nil {
		s.credentials = s.busCredentials
	}
	if s.polkit == nil {
		s.polkit = s.busPolkit
	}
	s.ifaces = s.interfaces()
	return s
}

// Start connects to the bus, exports the objects and takes the name
// dev.vgpud1. It fails when the bus cannot be reached or the name is
// owned by another connection (another vgpud) or refused by the bus
// policy. The service runs until Close, which the caller makes after the
// manager finished the operations in flight (their callers still get
// replies); operations are not cancelled when ctx ends, for that reason.
func Start(ctx context.Context, m *manager.Manager, opts Options) (*Service, error) {
	s := newService(m, opts)
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	snap, err := s.build()
	if err != nil {
		s.cancel()
		return nil, err
	}
	s.snap = snap
	conn, err := connect(opts.Address, dbus.WithHandler(s))
	if err != nil {
		s.cancel()
		return nil, err
	}
	s.conn = conn
	// Callers that leave the bus: cancel their operations, forget them.
	owners := make(chan *dbus.Signal, 256)
	conn.Signal(owners)
	if err := conn.AddMatchSignal(dbus.WithMatchSender("org.freedesktop.DBus"), dbus.WithMatchInterface("org.freedesktop.DBus"),
		dbus.WithMatchMember("NameOwnerChanged")); err != nil {
		conn.Close()
		s.cancel()
		return nil, fmt.Errorf("watch the bus for callers leaving: %w", err)
	}
	if err := s.requestName(); err != nil {
		conn.Close()
		s.cancel()
		return nil, err
	}
	events, unsubscribe := m.Subscribe()
	s.wg.Add(2)
	go func() { defer s.wg.Done(); s.watchOwners(owners) }()
	go func() { defer s.wg.Done(); defer unsubscribe(); s.watchManager(events) }()
	s.log.Info("D-Bus service ready", "name", BusName, "address", addressOrSystem(opts.Address), "unique", conn.Names()[0])
	return s, nil
}

func addressOrSystem(a string) string {
	if a == "" {
		return "system bus"
	}
	return a
}

func connect(address string, opts ...dbus.ConnOption) (*dbus.Conn, error) {
	var conn *dbus.Conn
	var err error
	if address == "" {
		conn, err = dbus.ConnectSystemBus(opts...)
	} else {
		conn, err = dbus.Connect(address, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to the D-Bus %s: %w", addressOrSystem(address), err)
	}
	return conn, nil
}

func (s *Service) requestName() error {
	reply, err := s.conn.RequestName(BusName, dbus.NameFlagDoNotQueue)
	if err != nil {
		var de dbus.Error
		if errors.As(err, &de) && de.Name == "org.freedesktop.DBus.Error.AccessDenied" {
			return fmt.Errorf("the bus policy does not let this user own %s; install systemd/dbus-1/dev.vgpud1.conf as /usr/share/dbus-1/system.d/dev.vgpud1.conf and reload dbus (%w)", BusName, err)
		}
		return fmt.Errorf("request bus name %s: %w", BusName, err)
	}
	switch reply {
	case dbus.RequestNameReplyPrimaryOwner, dbus.RequestNameReplyAlreadyOwner:
		return nil
	}
	who := ""
	var owner string
	if err := s.conn.BusObject().Call("org.freedesktop.DBus.GetNameOwner", 0, BusName).Store(&owner); err == nil {
		var pid uint32
		if err := s.conn.BusObject().Call("org.freedesktop.DBus.GetConnectionUnixProcessID", 0, owner).Store(&pid); err == nil {
			who = fmt.Sprintf(" (pid %d)", pid)
		}
	}
	return fmt.Errorf("bus name %s is owned by another process%s: another vgpud is running on this bus; stop it first", BusName, who)
}

// Close releases the name and closes the connection; operations in
// flight are cancelled.
func (s *Service) Close() error {
	s.closeOnce.Do(func() {
		// A call the manager finished during the stop is answered after
		// its method returns; closing first would leave its caller with
		// NoReply for a change that happened. Reads may keep arriving,
		// so the wait is bounded.
		deadline := time.Now().Add(closeDrain)
		for s.inFlight.Load() > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		s.cancel()
		if _, err := s.conn.ReleaseName(BusName); err != nil {
			s.log.Debug("release bus name", "err", err)
		}
		s.closeErr = s.conn.Close()
		s.wg.Wait()
	})
	return s.closeErr
}

// closeDrain bounds how long Close waits for calls being served.
const closeDrain = 5 * time.Second

// watchOwners follows NameOwnerChanged: a caller that left the bus has
// its operations cancelled and its credentials forgotten.
func (s *Service) watchOwners(ch <-chan *dbus.Signal) {
	for {
		select {
		case <-s.ctx.Done():
			return
		case sig, ok := <-ch:
			if !ok {
				return
			}
			if sig.Name != "org.freedesktop.DBus.NameOwnerChanged" || len(sig.Body) != 3 {
				continue
			}
			name, _ := sig.Body[0].(string)
			newOwner, _ := sig.Body[2].(string)
			if newOwner != "" || len(name) == 0 || name[0] != ':' {
				continue
			}
			if n := s.ops.cancelSender(name); n > 0 {
				s.log.Info("caller left the bus: its operations are cancelled", "sender", name, "operations", n)
			}
			s.creds.forget(name)
		}
	}
}

// watchManager turns manager events into signals, re-reading the objects
// first so that PropertiesChanged and InterfacesAdded/Removed precede the
// event's own signal.
func (s *Service) watchManager(events <-chan manager.Event) {
	t := time.NewTicker(s.opts.ResyncInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			s.sync()
		case e, ok := <-events:
			if !ok {
				return
			}
			batch := []manager.Event{e}
		drain:
			for len(batch) < 256 {
				select {
				case e, ok := <-events:
					if !ok {
						break drain
					}
					batch = append(batch, e)
				default:
					break drain
				}
			}
			s.sync()
			for _, e := range batch {
				s.emitEvent(e)
			}
		}
	}
}

// replyError logs a failed call with its internal cause and returns the
// named error the caller sees.
func (s *Service) replyError(c *call, err error) error {
	de := toDBusError(err)
	s.log.Info("call failed", "method", c.member, "path", string(c.path), "sender", c.sender, "error", de.Name, "err", err)
	return de
}
