package dbusapi

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/manager"
)

// laggingFleet is a manager fleet whose Placement does not answer: claims
// and settles fail (the operations go on; the sync would catch up).
type laggingFleet struct {
	mu   sync.Mutex
	down bool
}

func (f *laggingFleet) err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return errors.New("placement: unreachable: connection refused")
	}
	return nil
}

func (f *laggingFleet) Claim(context.Context, manager.FleetClaim) error { return f.err() }
func (f *laggingFleet) Unclaim(string)                                  {}
func (f *laggingFleet) Adopt(context.Context, string) (manager.FleetClaim, error) {
	return manager.FleetClaim{}, manager.ErrNotFound
}
func (f *laggingFleet) Complete(context.Context, manager.FleetClaim) error { return nil }
func (f *laggingFleet) Settle(context.Context, string, string) error       { return f.err() }
func (f *laggingFleet) Move(context.Context, string, string) error         { return f.err() }

// TestPlacementBehindReachesTheCaller: a create, a create-and-attach and a
// destroy that succeed while Placement does not answer tell their caller
// (the PlacementBehind signal, sent before the reply, read by the client
// into the result); a second client's operations are not reported to the
// first, and operations that kept their promise report nothing.
func TestPlacementBehindReachesTheCaller(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	e.tenant("acme", unlimitedQuota())
	f := &laggingFleet{down: true}
	e.m.SetFleet(f)
	defer e.m.SetFleet(nil)
	ctx := ctxT(t)

	in, err := e.client.Create(ctx, CreateRequest{Tenant: "acme", Profile: "1g.10gb"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(in.PlacementBehind, "allocation not written before carving") || !strings.Contains(in.PlacementBehind, "unreachable") {
		t.Fatalf("create's PlacementBehind = %q, want the claim left to the sync and why", in.PlacementBehind)
	}
	other := e.dial()
	in2, err := other.Create(ctx, CreateRequest{Tenant: "acme", Profile: "1g.10gb"})
	if err != nil {
		t.Fatal(err)
	}
	behind, err := e.client.DestroyBehind(ctx, in.UUID, false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(behind, "not brought up to date") || strings.Contains(behind, in2.UUID) {
		t.Fatalf("destroy's PlacementBehind = %q, want the settle left to the sync for %s only", behind, in.UUID)
	}

	f.mu.Lock()
	f.down = false
	f.mu.Unlock()
	in3, err := e.client.Create(ctx, CreateRequest{Tenant: "acme", Profile: "1g.10gb"})
	if err != nil {
		t.Fatal(err)
	}
	if in3.PlacementBehind != "" {
		t.Fatalf("a create that kept its promise reports %q", in3.PlacementBehind)
	}
	for _, id := range []string{in2.UUID, in3.UUID} {
		if behind, err := e.client.DestroyBehind(ctx, id, false); err != nil || behind != "" {
			t.Fatalf("destroy %s with Placement answering = %q, %v; want nothing behind", id, behind, err)
		}
	}
}
