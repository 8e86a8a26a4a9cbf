package manager_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/virt"
)

// liveVersions are the versions each fake libvirt reports (default:
// Debian 12's, QEMU 7.2).
var liveVersions sync.Map // *migVirt -> virt.HostVersions

func (v *migVirt) HostVersions(context.Context) (virt.HostVersions, error) {
	if x, ok := liveVersions.Load(v); ok {
		return x.(virt.HostVersions), nil
	}
	return virt.HostVersions{Host: "debian12", Libvirt: virt.Version{Major: 9, Minor: 0, Micro: 0}, QEMU: virt.Version{Major: 7, Minor: 2, Micro: 22}, Kernel: virt.Version{Major: 6, Minor: 1, Micro: 0}}, nil
}

// PrecheckLive applies virt.CheckLiveMigration as Conn.PrecheckLive does:
// the domain holds a VFIO device while it runs with one live.
func (v *migVirt) PrecheckLive(ctx context.Context, ref string, dst virt.HostVersions) error {
	src, _ := v.HostVersions(ctx)
	v.mu.Lock()
	d, err := v.find(ref)
	vfio := false
	if err == nil {
		for _, a := range d.devs {
			vfio = vfio || (d.running && a.Live)
		}
	}
	v.mu.Unlock()
	if err != nil {
		return err
	}
	if err := virt.CheckLiveMigration(src, dst, vfio); err != nil {
		return fmt.Errorf("domain %s: %w", ref, err)
	}
	return nil
}

func (v *migVirt) MigrateLive(context.Context, string, virt.LiveMigration) error {
	return errors.New("not in this test")
}

// liveJobs are the jobs each fake libvirt runs on its domain (default:
// none).
var liveJobs sync.Map // *migVirt -> virt.MigrationProgress

// MigrationProgress reports the domain's job as Conn.MigrationProgress
// does: no job is an inactive one, and a shut-off domain has none to ask.
func (v *migVirt) MigrationProgress(_ context.Context, ref string) (virt.MigrationProgress, error) {
	v.mu.Lock()
	d, err := v.find(ref)
	running := err == nil && d.running
	v.mu.Unlock()
	if err != nil {
		return virt.MigrationProgress{}, err
	}
	if !running {
		// libvirt's word for a shut-off domain's job stats.
		return virt.MigrationProgress{}, fmt.Errorf("domain %s: job stats: Requested operation is not valid: domain is not running", ref)
	}
	if x, ok := liveJobs.Load(v); ok {
		return x.(virt.MigrationProgress), nil
	}
	return virt.MigrationProgress{}, nil
}

// A live migration runs on the source until its switchover: a restart of
// the source, or a reconcile once the hold passed, while libvirt's
// outgoing job runs on the VM leaves the migration as it is (the intent,
// and the migration consumer holding the allocation while the
// destination holds the instance's), and the migration's calls end it
// once libvirt moved the VM.
func TestOutgoingStillMovingIsKept(t *testing.T) {
	for _, how := range []string{"restart", "hold"} {
		t.Run(how, func(t *testing.T) {
			ctx := context.Background()
			src, dst := newMigHostHolding(t, nil, 20*time.Millisecond), newMigHost(t, nil)
			rec := src.running("L4-4Q")
			md, err := src.m.MigrationSource(ctx, rec.UUID)
			if err != nil {
				t.Fatal(err)
			}
			in, err := dst.m.PrepareIncoming(ctx, md, "", "")
			if err != nil {
				t.Fatal(err)
			}
			consumer := migrationConsumerOf(t, src.env, rec.UUID)
			if consumer == "" {
				t.Fatal("MigrationSource named no migration consumer")
			}
			liveJobs.Store(src.v, virt.MigrationProgress{Active: true, Operation: 5})
			t.Cleanup(func() { liveJobs.Delete(src.v) })
			var rep manager.ReconcileReport
			if how == "restart" {
				rep = src.restart()
			} else {
				time.Sleep(100 * time.Millisecond)
				if rep, err = src.m.Reconcile(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if len(intents(t, src.env)) != 1 || len(rep.Undone) != 0 || len(rep.Pending) == 0 {
				t.Fatalf("the VM still moving: report %+v, intents %+v; want the migration left pending", rep, intents(t, src.env))
			}
			if got := migrationConsumerOf(t, src.env, rec.UUID); got != consumer {
				t.Fatalf("the VM still moving: the record's migration consumer is %q, want %q", got, consumer)
			}
			if src.m.HasConsumer(rec.UUID) || !src.m.HasConsumer(consumer) {
				t.Fatal("the VM still moving: the instance's UUID holds the allocation here again")
			}

			liveJobs.Delete(src.v)
			moveVM(t, src, dst, rec, in)
			if _, err := dst.m.CommitIncoming(ctx, rec.UUID); err != nil {
				t.Fatal(err)
			}
			if err := src.m.CompleteOutgoing(ctx, rec.UUID); err != nil {
				t.Fatalf("CompleteOutgoing once libvirt moved the VM: %v", err)
			}
			if _, err := src.m.Instance(rec.UUID); !errors.Is(err, manager.ErrNotFound) || len(intents(t, src.env)) != 0 {
				t.Fatalf("after the move: %v, intents %+v; want the source's instance released", err, intents(t, src.env))
			}
			assertConsistent(t, src.env)
			assertConsistent(t, dst.env)
		})
	}
}

// migrationConsumerOf is the migration consumer instance id's record
// names ("" none).
func migrationConsumerOf(t *testing.T, e *env, id string) string {
	t.Helper()
	var c string
	if err := e.db.View(func(tx *store.Tx) error {
		r, err := tx.Instance(id)
		c = r.MigrationConsumer
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

// A running VM holding its vGPU does not move live where QEMU is 7.2:
// the source refuses before the destination is asked for anything, naming
// the reason with each end's version, and changes nothing; on new enough
// versions the check passes.
func TestPrecheckOutgoingLive(t *testing.T) {
	ctx := context.Background()
	src, dst := newMigHost(t, nil), newMigHost(t, nil)
	rec := src.running("A10-4Q")
	dstV, err := dst.m.MigrationTarget(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = src.m.PrecheckOutgoingLive(ctx, rec.UUID, dstV)
	if !errors.Is(err, manager.ErrConflict) || !errors.Is(err, virt.ErrLiveMigrationRefused) {
		t.Fatalf("precheck on QEMU 7.2: %v, want Conflict wrapping ErrLiveMigrationRefused", err)
	}
	for _, w := range []string{"qemu_too_old: QEMU 7.2.22 on the source (debian12) is older than 8.1.0", "qemu_too_old: QEMU 7.2.22 on the destination"} {
		if !strings.Contains(manager.Message(err), w) {
			t.Errorf("refusal %q lacks %q", manager.Message(err), w)
		}
	}
	if its := intents(t, src.env); len(its) != 0 {
		t.Fatalf("the refusal left intents: %+v", its)
	}
	if insts, _ := dst.m.AllInstances(); len(insts) != 0 {
		t.Fatalf("the destination carved: %+v", insts)
	}
	fresh := virt.HostVersions{Host: "new", Libvirt: virt.Version{Major: 10, Minor: 0, Micro: 0}, QEMU: virt.Version{Major: 8, Minor: 2, Micro: 0}, Kernel: virt.Version{Major: 6, Minor: 8, Micro: 0}}
	liveVersions.Store(src.v, fresh)
	t.Cleanup(func() { liveVersions.Delete(src.v) })
	if err := src.m.PrecheckOutgoingLive(ctx, rec.UUID, fresh); err != nil {
		t.Fatalf("precheck on QEMU 8.2: %v", err)
	}
	if err := src.m.PrecheckOutgoingLive(ctx, "0f0f0f0f-0000-4000-8000-000000000000", fresh); !errors.Is(err, manager.ErrNotFound) {
		t.Fatalf("precheck of an unknown instance: %v, want NotFound", err)
	}
}

// A shut-off VM moves offline, with no libvirt job (and libvirt refuses to
// report a shut-off domain's job): a source restart that finds it still
// defined here resolves the cut-off migration as stayed, as before live
// moves were asked about, instead of leaving it pending on the refusal.
func TestOutgoingShutOffStayedAtRestart(t *testing.T) {
	ctx := context.Background()
	src := newMigHost(t, nil)
	rec := src.running("L4-4Q")
	src.v.mu.Lock()
	src.v.doms[migVM].running = false
	src.v.mu.Unlock()
	if err := src.sim.CloseDevice(hostDevice(rec)); err != nil {
		t.Fatal(err)
	}
	if _, err := src.m.MigrationSource(ctx, rec.UUID); err != nil {
		t.Fatal(err)
	}
	rep := src.restart()
	if len(rep.Pending) != 0 || len(intents(t, src.env)) != 0 {
		t.Fatalf("a shut-off VM still defined here after a restart: report %+v, intents %+v; want the migration resolved as stayed", rep, intents(t, src.env))
	}
	if len(rep.Undone) != 1 || rep.Undone[0] != rec.UUID {
		t.Fatalf("report %+v: want %s undone (stayed)", rep, rec.UUID)
	}
	if !src.m.HasConsumer(rec.UUID) {
		t.Fatal("the instance that stayed does not hold its allocation under its UUID")
	}
	assertConsistent(t, src.env)
}
