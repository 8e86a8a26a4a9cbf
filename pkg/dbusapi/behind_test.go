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
func (f *laggingFleet) Stale(context.Context, string, string)              {}
func (f *laggingFleet) Expect() func()                                     { return func() {} }

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

// TestPlacementBehindMigration: a migration's calls that could not move
// the VM's allocation in Placement (it does not answer) succeed and tell
// their caller (the PlacementBehind signal, operation migrate); with
// Placement answering they report nothing.
func TestPlacementBehindMigration(t *testing.T) {
	ctx := ctxT(t)
	const vm, vmUUID = "web1", "8c0f6a3e-2d1b-4e5f-9a7c-6b5d4e3f2a11"
	e := newEnv(t, testbus.Options{}, nil)
	e.tenant("acme", unlimitedQuota())
	v := &hostVirt{doms: map[string]*hostDom{}}
	e.m.SetVirt(v)
	v.define(vm, vmUUID)
	inst := e.create("acme", "L4-4Q", "")
	if _, err := e.client.Attach(ctx, inst.UUID, vm, AttachOptions{}); err != nil {
		t.Fatal(err)
	}
	rec, err := e.m.Instance(inst.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.sim.OpenDevice(rec.VF, vmUUID, vm); err != nil {
		t.Fatal(err)
	}
	f := &laggingFleet{down: true}
	e.m.SetFleet(f)
	defer e.m.SetFleet(nil)
	behind := e.client.watchBehind(ctx)
	if _, err := e.client.MigrationSource(ctx, inst.UUID); err != nil {
		t.Fatal(err)
	}
	if got := behind(inst.UUID); !strings.Contains(got, "not moved in Placement") || !strings.Contains(got, "unreachable") {
		t.Fatalf("MigrationSource's PlacementBehind = %q, want the move left to the sync and why", got)
	}
	f.mu.Lock()
	f.down = false
	f.mu.Unlock()
	behind = e.client.watchBehind(ctx)
	if err := e.client.CancelOutgoing(ctx, inst.UUID); err != nil {
		t.Fatal(err)
	}
	if got := behind(inst.UUID); got != "" {
		t.Fatalf("a cancel that kept its promise reports %q", got)
	}
	f.mu.Lock()
	f.down = true
	f.mu.Unlock()
	if _, err := e.client.MigrationSource(ctx, inst.UUID); err != nil {
		t.Fatal(err)
	}
	behind = e.client.watchBehind(ctx)
	if err := e.client.CancelOutgoing(ctx, inst.UUID); err != nil {
		t.Fatal(err)
	}
	if got := behind(inst.UUID); !strings.Contains(got, "not moved in Placement") {
		t.Fatalf("CancelOutgoing's PlacementBehind = %q, want the move back left to the sync", got)
	}
}
