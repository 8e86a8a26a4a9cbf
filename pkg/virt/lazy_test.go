package virt_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv/libvirtd"
	"github.com/vgpud/vgpud/pkg/virt"
)

// Before the first connection, calls wait ReconnectWait and are refused
// with ErrUnreachable, Quiesce has nothing to wait for, Events waits as long
// as its ctx lives, and Connect gives up when its ctx ends. No libvirtd is
// needed: nothing listens on the socket.
func TestLazyNotConnected(t *testing.T) {
	const wait = 500 * time.Millisecond
	l := virt.NewLazy(virt.Config{
		URI: "qemu:///system", Socket: filepath.Join(t.TempDir(), "nosuch-sock"),
		DialTimeout: time.Second, ReconnectWait: wait,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	})
	t.Cleanup(func() { l.Close() })
	ctx := ctxT(t)

	if l.Ready() {
		t.Fatal("Ready before any connection")
	}
	if got := l.URI(); got != "qemu:///system" {
		t.Fatalf("URI = %q", got)
	}
	if err := l.TryConnect(ctx, time.Second); !errors.Is(err, virt.ErrUnreachable) {
		t.Fatalf("TryConnect = %v, want ErrUnreachable", err)
	}

	calls := []struct {
		name string
		call func(context.Context) error
	}{
		{"Domain", func(ctx context.Context) error { _, err := l.Domain(ctx, "vm"); return err }},
		{"Domains", func(ctx context.Context) error { _, err := l.Domains(ctx); return err }},
		{"Attach", func(ctx context.Context) error { _, err := l.Attach(ctx, "vm", mdevA, "inst-1"); return err }},
		{"Detach", func(ctx context.Context) error { return l.Detach(ctx, "vm", mdevA, "inst-1") }},
		{"Attached", func(ctx context.Context) error { _, err := l.Attached(ctx, "vm"); return err }},
		{"DomainXML", func(ctx context.Context) error { _, err := l.DomainXML(ctx, "vm", true); return err }},
		{"DestinationXML", func(ctx context.Context) error { _, err := l.DestinationXML(ctx, "vm", mdevA, mdevB, ""); return err }},
		{"HostVersions", func(ctx context.Context) error { _, err := l.HostVersions(ctx); return err }},
		{"PrecheckLive", func(ctx context.Context) error { return l.PrecheckLive(ctx, "vm", virt.HostVersions{}) }},
		{"MigrateLive", func(ctx context.Context) error {
			return l.MigrateLive(ctx, "vm", virt.LiveMigration{DestURI: "qemu+tls://b/system"})
		}},
		{"MigrationProgress", func(ctx context.Context) error { _, err := l.MigrationProgress(ctx, "vm"); return err }},
		{"AbortMigration", func(ctx context.Context) error { return l.AbortMigration(ctx, "vm") }},
		{"DefineMigrated", func(ctx context.Context) error { _, err := l.DefineMigrated(ctx, "<domain/>"); return err }},
		{"UndefineMigrated", func(ctx context.Context) error { return l.UndefineMigrated(ctx, "vm") }},
	}
	for _, c := range calls {
		t.Run(c.name+"/after ReconnectWait", func(t *testing.T) {
			start := time.Now()
			err := c.call(ctx)
			elapsed := time.Since(start)
			if !errors.Is(err, virt.ErrUnreachable) {
				t.Fatalf("%s = %v, want ErrUnreachable", c.name, err)
			}
			if elapsed < wait || elapsed > wait+2*time.Second {
				t.Fatalf("%s refused after %v, ReconnectWait is %v", c.name, elapsed, wait)
			}
		})
		t.Run(c.name+"/ctx ends first", func(t *testing.T) {
			cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := c.call(cctx)
			if !errors.Is(err, virt.ErrUnreachable) {
				t.Fatalf("%s = %v, want ErrUnreachable", c.name, err)
			}
			if elapsed := time.Since(start); elapsed >= wait {
				t.Fatalf("%s refused after %v, not when its ctx ended", c.name, elapsed)
			}
		})
	}

	t.Run("Quiesce", func(t *testing.T) {
		start := time.Now()
		if err := l.Quiesce(ctx); err != nil {
			t.Fatalf("Quiesce = %v", err)
		}
		if elapsed := time.Since(start); elapsed >= wait {
			t.Fatalf("Quiesce waited %v for a connection", elapsed)
		}
	})

	t.Run("Events wait for ctx", func(t *testing.T) {
		ectx, cancel := context.WithTimeout(ctx, 2*wait)
		defer cancel()
		start := time.Now()
		events := l.Events(ectx)
		if ev, ok := <-events; ok {
			t.Fatalf("event %+v without a connection", ev)
		}
		if elapsed := time.Since(start); elapsed < 2*wait {
			t.Fatalf("Events closed after %v, before its ctx ended", elapsed)
		}
	})

	t.Run("Connect gives up with ctx", func(t *testing.T) {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			l.Connect(cctx, func() { t.Error("onReady without a connection") })
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Connect still running 10s after its ctx ended")
		}
		if l.Ready() {
			t.Fatal("Ready after failed attempts")
		}
	})
}

// A Lazy made while libvirtd is down: a call made meanwhile and an event
// subscription both get through once Connect reaches the libvirtd that
// comes up, and onReady runs once it has.
func TestLazyConnect(t *testing.T) {
	env := libvirtd.Start(t)
	ctx := ctxT(t)
	l := virt.NewLazy(virt.Config{
		Socket: env.Socket(), ReconnectWait: 45 * time.Second, DetachTimeout: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	})
	t.Cleanup(func() { l.Close() })
	events := l.Events(ctx)

	down := env.Owned()
	if down {
		env.StopDaemon(t)
	} else {
		t.Log("libvirtd not started by the harness: it stays up, the wait for it is not tested")
	}
	type result struct {
		n   int
		err error
	}
	early := make(chan result, 1)
	go func() {
		ds, err := l.Domains(ctx)
		early <- result{len(ds), err}
	}()
	ready := make(chan struct{})
	go l.Connect(ctx, func() { close(ready) })
	if down {
		select {
		case <-ready:
			t.Fatal("onReady while libvirtd is down")
		case <-time.After(500 * time.Millisecond):
		}
		env.StartDaemon(t)
	}
	select {
	case <-ready:
	case <-time.After(40 * time.Second):
		t.Fatal("Connect did not reach libvirtd within 40s")
	}
	if !l.Ready() {
		t.Fatal("not Ready after onReady")
	}
	if r := <-early; r.err != nil {
		t.Fatalf("Domains made before the connection = %v", r.err)
	}

	dom := env.DefineDomain(t, "virt-lazy")
	got, err := l.Domain(ctx, dom.Name)
	if err != nil || got.UUID != dom.UUID {
		t.Fatalf("Domain = %+v, %v; want UUID %s", got, err, dom.UUID)
	}
	timeout := time.After(20 * time.Second)
	for defined := false; !defined; {
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatal("event channel closed")
			}
			defined = e.UUID == dom.UUID && e.Kind == virt.Defined
		case <-timeout:
			t.Fatal("no Defined event within 20s through Events subscribed before the connection")
		}
	}
	if err := l.Quiesce(ctx); err != nil {
		t.Fatalf("Quiesce = %v", err)
	}

	// Once connected, TryConnect has nothing to do and Connect calls
	// onReady at once.
	if err := l.TryConnect(ctx, time.Millisecond); err != nil {
		t.Fatalf("TryConnect when connected = %v", err)
	}
	again := false
	l.Connect(ctx, func() { again = true })
	if !again {
		t.Fatal("Connect when connected did not call onReady")
	}
}
