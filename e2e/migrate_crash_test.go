package e2e

import (
	"strings"
	"testing"
	"time"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/internal/testenv/libvirtd"
	"github.com/vgpud/vgpud/pkg/manager"
)

// migrateCrash is a crash point of an offline move and the host whose
// vgpud reaches it on `vgpuctl migrate run`'s way; rollback: on the way of
// a move rolled back after the destination defined the VM (the source's
// libvirt refuses to undefine it: it has a snapshot).
type migrateCrash struct {
	point    string
	source   bool
	rollback bool
}

func (c migrateCrash) name() string {
	if c.rollback {
		return c.point + "-rollback"
	}
	return c.point
}

// The crash points an offline move of a shut-off VM passes, in order: the
// source records its outgoing intent and moves its allocation to the
// migration's consumer where it has a fleet (MigrationSource); the destination
// records its incoming intent, carves, and is about to record the VM's
// attachment (PrepareIncoming, CommitIncoming); the source releases its
// instance once the VM left (CompleteOutgoing). A move rolled back after
// the destination defined the VM passes the destination's release of its
// instance (AbortIncoming, once UndefineIncomingDomain gave the
// definition back).
var migrateCrashes = []migrateCrash{
	{manager.CrashOutgoingIntent, true, false},
	{manager.CrashOutgoingMove, true, false},
	{manager.CrashIncomingIntent, false, false},
	{manager.CrashIncomingCarve, false, false},
	{manager.CrashIncomingCommit, false, false},
	{manager.CrashMigrationRelease, true, false},
	{manager.CrashMigrationRelease, false, true},
}

// TestMigrateKilledAtEachStep: the vgpud of one end of `vgpuctl migrate
// run` is killed (kill -9 at a crash point) at each step of an offline
// move of a VM with a legacy-mdev vGPU. Once it is started again (its
// start reconciles), no intent is left on either host, neither host has a
// device without a record or a record without its device, each tenant's
// usage is the sum of its instances, the VM is defined on exactly one
// libvirtd (the source's, for a move being rolled back), and exactly that
// host records its attachment, to the device the domain's definition
// names.
func TestMigrateKilledAtEachStep(t *testing.T) {
	for _, c := range migrateCrashes {
		t.Run(c.name(), func(t *testing.T) { migrateKilledAt(t, c) })
	}
}

func migrateKilledAt(t *testing.T, c migrateCrash) {
	srcLV, dstLV := libvirtd.StartPair(t)
	crashEnv := []string{"VGPUD_CRASH_AT=" + c.point}
	var srcEnv, dstEnv []string
	if c.source {
		srcEnv = crashEnv
	} else {
		dstEnv = crashEnv
	}
	srcBus, dstBus := testbus.Start(t), testbus.Start(t)
	src := startBusDaemon(t, srcBus, busDaemonOpts{libvirtSocket: srcLV.Socket(), env: srcEnv})
	dst := startBusDaemon(t, dstBus, busDaemonOpts{libvirtSocket: dstLV.Socket(), env: dstEnv})
	for _, d := range []*busDaemon{src, dst} {
		d.ctl(t, "tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited").must(t, "tenant define")
	}
	vm := srcLV.DefineDomain(t, "vgpud-e2e-crash")
	dstLV.RemoveAtCleanup(t, vm)
	in := decodeSchema[docInstance](t, src.ctl(t, "create", "A10-4Q", "--tenant", "acme", "-o", "json").must(t, "create")).Instance
	src.ctl(t, "attach", vm.Name, in.UUID).must(t, "attach")
	if c.rollback {
		srcLV.SnapshotDomain(t, vm.Name)
	}

	victim, victimLV := dst, dstLV
	if c.source {
		victim, victimLV = src, srcLV
	}
	r := src.ctl(t, "migrate", "run", in.UUID, "--to", dst.bus.Address())
	if r.code == 0 {
		t.Fatalf("migrate run succeeded though a vgpud was to die at %s:\n%s", c.point, r.out)
	}
	select {
	case <-victim.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("vgpud did not die at %s; migrate run: exit %d, %s", c.point, r.code, r.err)
	}
	if !strings.Contains(victim.log(), "crash point "+c.point+" reached") {
		t.Fatalf("vgpud died (%v), but not at %s:\n%s", victim.err, c.point, tailText(victim.log(), 4000))
	}
	restarted := startBusDaemon(t, victim.bus, busDaemonOpts{libvirtSocket: victimLV.Socket(), stateDir: victim.stateDir})
	if c.source {
		src = restarted
	} else {
		dst = restarted
	}
	if c.point == manager.CrashIncomingCommit && !strings.Contains(r.err, "did not record it (its next start does") {
		// The VM left the source before the destination died: migrate run
		// completed the source all the same and says so.
		t.Fatalf("migrate run after the destination died at its commit: %s", r.err)
	}
	for _, d := range []*busDaemon{src, dst} {
		awaitNoneUnresolved(t, d, 30*time.Second)
	}

	// The VM is defined on exactly one libvirtd, and that host alone
	// records its attachment, to the device its definition names.
	_, srcErr := srcLV.VirshErr("dominfo", vm.Name)
	_, dstErr := dstLV.VirshErr("dominfo", vm.Name)
	if (srcErr == nil) == (dstErr == nil) {
		t.Fatalf("after a crash at %s the VM is defined on the source: %v, on the destination: %v", c.point, srcErr == nil, dstErr == nil)
	}
	home, homeLV, other := src, srcLV, dst
	if dstErr == nil {
		home, homeLV, other = dst, dstLV, src
	}
	if c.rollback && dstErr == nil {
		t.Fatalf("the move was given up, but the VM is on the destination: %s", r.err)
	}
	x := homeLV.Virsh(t, "dumpxml", "--inactive", vm.Name)
	var held []schemaInstance
	for _, i := range instances(t, home) {
		if i.Attachment != nil && i.Attachment.VMUUID == vm.UUID {
			held = append(held, i)
		}
	}
	if len(held) != 1 {
		t.Fatalf("the host the VM is on holds %d attachments of it: %+v", len(held), held)
	}
	if want := hostdevNames(held[0]); !strings.Contains(x, want) {
		t.Fatalf("the VM's definition does not name its device %s:\n%s", want, x)
	}
	for _, i := range instances(t, other) {
		if i.Attachment != nil && i.Attachment.VMUUID == vm.UUID {
			t.Fatalf("the host the VM is not on records its attachment: %+v", i)
		}
	}
	checkUsage(t, "source", src)
	checkUsage(t, "destination", dst)

	// With the daemons stopped: no intent left, and every device on the
	// simulated host has its record and every record its device.
	noIntentsNorLeaks(t, &migrateHosts{srcLV: srcLV, dstLV: dstLV, src: src, dst: dst})
}

// awaitNoneUnresolved waits until a reconcile of d leaves nothing pending
// or failed.
func awaitNoneUnresolved(t *testing.T, d *busDaemon, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		r := d.ctl(t, "reconcile").must(t, "reconcile")
		if strings.Contains(r.out, " 0 failed") && strings.Contains(r.out, " 0 pending") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("reconcile still leaves work after %v:\n%s", within, r.out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
