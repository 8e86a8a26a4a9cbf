package virt_test

import (
	"errors"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv/libvirtd"
	"github.com/vgpud/vgpud/pkg/virt"
)

// TestGoneLibvirtdRefusesAtOnce: a call made while libvirtd restarts waits
// for it (TestReconnect), but once libvirtd has been gone for longer than
// ReconnectWait, calls are refused at once with ErrUnreachable instead of
// waiting out the caller's timeout; when it is back they work again.
func TestGoneLibvirtdRefusesAtOnce(t *testing.T) {
	env := libvirtd.Start(t)
	if !env.Owned() {
		t.Skip("libvirtd not started by the harness; cannot stop it")
	}
	const wait = 500 * time.Millisecond
	c := connect(t, env, virt.Config{ReconnectWait: wait})
	ctx := ctxT(t)
	dom := env.DefineDomain(t, "virt-gone")
	env.StopDaemon(t)
	time.Sleep(2 * wait)
	start := time.Now()
	_, err := c.Domain(ctx, dom.Name)
	if !errors.Is(err, virt.ErrUnreachable) {
		t.Fatalf("Domain with libvirtd gone: %v, want ErrUnreachable", err)
	}
	// Refused without waiting for the caller's minute; generous bound for
	// a loaded machine, far below the context's.
	if took := time.Since(start); took > 10*wait {
		t.Fatalf("refusal took %v; want it at once", took)
	}
	env.StartDaemon(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err = c.Domain(ctx, dom.Name); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("libvirtd back, calls still fail: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
