package manager_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/virt"
)

// The calls that end a migration act only on what libvirt says: a cancel
// after the VM left, an abort while libvirt does not answer or while the
// VM is defined here naming the device (running or not), and a commit
// for a domain still migrating (transient) or for another domain of the
// VM's name are refused, and change nothing.
func TestMigrationEndsActOnLibvirtsWord(t *testing.T) {
	ctx := context.Background()
	src, dst := newMigHost(t, nil), newMigHost(t, nil)
	rec := src.running("L4-4Q")
	md, err := src.m.MigrationSource(ctx, rec.UUID)
	if err != nil {
		t.Fatal(err)
	}
	in, err := dst.m.PrepareIncoming(ctx, md, "", "")
	if err != nil {
		t.Fatal(err)
	}
	unchanged := func(what string) {
		t.Helper()
		if _, err := dst.m.Instance(rec.UUID); err != nil || len(intents(t, dst.env)) != 1 || attachment(t, dst.env, rec.UUID) != nil {
			t.Fatalf("%s changed the destination: %v, intents %+v", what, err, intents(t, dst.env))
		}
		if _, err := src.m.Instance(rec.UUID); err != nil || len(intents(t, src.env)) != 1 {
			t.Fatalf("%s changed the source: %v, intents %+v", what, err, intents(t, src.env))
		}
	}

	// libvirt's migration under way: the domain is here transient, the
	// device live only.
	dst.v.mu.Lock()
	dst.v.doms[migVM] = &migDom{name: migVM, uuid: migVMUUID, running: false,
		devs: []virt.Attached{{Instance: rec.UUID, Hostdev: hostdev(in.Instance), Live: true, MetadataLive: true}}}
	dst.v.mu.Unlock()
	if _, err := dst.m.CommitIncoming(ctx, rec.UUID); !errors.Is(err, manager.ErrConflict) {
		t.Fatalf("commit while the domain is still migrating (transient): %v, want Conflict", err)
	}
	unchanged("a commit of a transient domain")

	// Another domain of the VM's name names the device.
	dst.v.define(migVM, "0b8f2d9e-1111-4222-8333-944455556666", rec.UUID, hostdev(in.Instance))
	if _, err := dst.m.CommitIncoming(ctx, rec.UUID); !errors.Is(err, manager.ErrConflict) {
		t.Fatalf("commit of another domain of the VM's name: %v, want Conflict", err)
	}
	unchanged("a commit of another domain")
	dst.v.undefine(migVM)

	// libvirt does not answer: an abort releases nothing.
	dst.v.mu.Lock()
	dst.v.down = fmt.Errorf("libvirt: %w", virt.ErrUnreachable)
	dst.v.mu.Unlock()
	if err := dst.m.AbortIncoming(ctx, rec.UUID); err == nil {
		t.Fatal("abort while libvirt does not answer released the instance")
	}
	unchanged("an abort while libvirt is down")
	dst.v.mu.Lock()
	dst.v.down = nil
	dst.v.mu.Unlock()

	// The VM moved; it is defined here naming the device but shut off.
	moveVM(t, src, dst, rec, in)
	dst.v.mu.Lock()
	dst.v.doms[migVM].running = false
	dst.v.mu.Unlock()
	if err := dst.m.AbortIncoming(ctx, rec.UUID); !errors.Is(err, manager.ErrBusy) {
		t.Fatalf("abort while the VM is defined here with the device: %v, want Busy", err)
	}
	// And a cancel on the source, which the VM left, would keep its
	// attachment on both hosts.
	if err := src.m.CancelOutgoing(ctx, rec.UUID); !errors.Is(err, manager.ErrConflict) {
		t.Fatalf("cancel after the VM left the source: %v, want Conflict", err)
	}
	unchanged("a refused abort and cancel")

	if _, err := dst.m.CommitIncoming(ctx, rec.UUID); err != nil {
		t.Fatal(err)
	}
	if err := src.m.CompleteOutgoing(ctx, rec.UUID); err != nil {
		t.Fatal(err)
	}
	assertConsistent(t, src.env)
	assertConsistent(t, dst.env)
}

// A second PrepareIncoming of the same instance answers the first only
// when it asks the same: another tenant is a Conflict, never the first
// answer under another name.
func TestPrepareIncomingAgainAsksTheSame(t *testing.T) {
	ctx := context.Background()
	src, dst := newMigHost(t, nil), newMigHost(t, nil)
	dst.tenant("globex", unlimited())
	rec := src.running("L4-4Q")
	md, err := src.m.MigrationSource(ctx, rec.UUID)
	if err != nil {
		t.Fatal(err)
	}
	in, err := dst.m.PrepareIncoming(ctx, md, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dst.m.PrepareIncoming(ctx, md, "", "globex"); !errors.Is(err, manager.ErrConflict) {
		t.Fatalf("a second prepare for another tenant: %v, want Conflict", err)
	}
	if again, err := dst.m.PrepareIncoming(ctx, md, "", ""); err != nil || again.Device != in.Device {
		t.Fatalf("the same prepare again: %+v, %v", again, err)
	}
}

// A plain MIG instance (compute only) is attached to no VM and cannot be:
// MigrationSource refuses it as InvalidArgument, saying so, and records
// nothing.
func TestMigrationSourceRefusesPlainMIG(t *testing.T) {
	src := newMigHost(t, nil)
	rec := src.mustCreate("acme", "1g.10gb", "")
	_, err := src.m.MigrationSource(context.Background(), rec.UUID)
	if !errors.Is(err, manager.ErrInvalidArgument) || !strings.Contains(manager.Message(err), "is a plain MIG instance (compute only): it is attached to no VM") {
		t.Fatalf("MigrationSource of a plain MIG instance: %v", err)
	}
	if its := intents(t, src.env); len(its) != 0 {
		t.Fatalf("the refusal left intents: %+v", its)
	}
}
