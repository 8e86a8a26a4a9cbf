package dbusapi

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// TestDBusStopAnswersOperationsInFlight plays a daemon's stop whose grace
// ends with a create stalled in the driver: CancelAll cancels it, and the
// caller has a named error before the service leaves the bus, long before
// the stall ends, instead of no reply (a timeout) when the daemon exits.
// The manager then finishes the undo, which the daemon's stop waits for.
func TestDBusStopAnswersOperationsInFlight(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	e.tenant("acme", unlimitedQuota())
	const stall = 5 * time.Second
	slowCreate(t, e, stall)
	done := make(chan error, 1)
	go func() {
		_, err := e.client.Create(ctxT(t), CreateRequest{Tenant: "acme", Profile: "1g.10gb", GPU: sim.DefaultH100MIG})
		done <- err
	}()
	testenv.WaitFor(t, "the create to be admitted", 10*time.Second, func() bool {
		insts, _ := e.m.TenantInstances("acme")
		return len(insts) == 1
	})

	grace, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := e.m.Shutdown(grace); err == nil {
		t.Fatal("Shutdown returned with a create stalled in the driver")
	}
	start := time.Now()
	wait, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	n, err := e.svc.CancelAll(wait, "vgpud is stopping")
	if n != 1 || err != nil {
		t.Fatalf("CancelAll = %d, %v; want the one create cancelled and returned", n, err)
	}
	if err := e.svc.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	select {
	case err = <-done:
	case <-time.After(stall):
		t.Fatal("the caller had no answer when the service left the bus")
	}
	var de *Error
	if !errors.As(err, &de) || de.Name != NameBusy || !strings.Contains(de.Message, "cancelled because vgpud is stopping") {
		t.Fatalf("caller got %v (%T), want Busy saying the create was cancelled because vgpud is stopping", err, err)
	}
	if took := time.Since(start); took > stall/2 {
		t.Fatalf("the caller was answered %v after CancelAll, want well before the %v stall ends", took, stall)
	}
	t.Logf("caller answered %v after CancelAll: %s: %s", time.Since(start).Round(time.Millisecond), de.Name, de.Message)

	undo, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.m.Shutdown(undo); err != nil {
		t.Fatalf("the undo did not finish: %v", err)
	}
	if insts, err := e.m.AllInstances(); err != nil || len(insts) != 0 {
		t.Fatalf("instances after the undo: %+v, %v", insts, err)
	}
}

// TestCancelAllWithNothingInFlight returns at once: a stop whose grace ran
// out only on operations the bus did not start has nothing to wait for.
func TestCancelAllWithNothingInFlight(t *testing.T) {
	s := newService(nil, Options{})
	start := time.Now()
	if n, err := s.CancelAll(context.Background(), "test"); n != 0 || err != nil {
		t.Fatalf("CancelAll = %d, %v", n, err)
	}
	if took := time.Since(start); took > replyWrite/2 {
		t.Fatalf("CancelAll with nothing in flight took %v", took)
	}
}
