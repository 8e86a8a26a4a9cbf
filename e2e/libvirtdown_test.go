package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/internal/testenv/libvirtd"
)

// reconcilePrompt is well under the libvirt pass's own deadline (a minute)
// and vgpuctl's call timeout: an answer later than this waited for libvirt.
const reconcilePrompt = 15 * time.Second

// TestReconcileLibvirtDown: with libvirtd stopped, or hung (SIGSTOP: its
// socket accepts, nothing answers), `vgpuctl reconcile` answers at once
// with the host part done and the libvirt part reported pending, saying
// why; once libvirtd is back vgpud reconnects and a reconcile has nothing
// pending.
func TestReconcileLibvirtDown(t *testing.T) {
	lv := libvirtd.Start(t)
	if !lv.Owned() {
		t.Skip("libvirtd not started by the harness: it cannot be stopped")
	}
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{libvirtSocket: lv.Socket()})
	vm := lv.DefineDomain(t, "e2e-lv-down") // short: vgpuctl list shows it whole
	d.ctl(t, "tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited").must(t, "tenant define")
	in := decodeSchema[docInstance](t, d.ctl(t, "create", "A10-4Q", "--tenant", "acme", "-o", "json").must(t, "create")).Instance
	d.ctl(t, "attach", vm.Name, in.UUID).must(t, "attach")
	if r := d.ctl(t, "reconcile").must(t, "reconcile"); !strings.Contains(r.out, " 0 pending") {
		t.Fatalf("reconcile with libvirtd up:\n%s", r.out)
	}

	reconcileDown := func(why string) {
		t.Helper()
		start := time.Now()
		r := d.ctl(t, "reconcile").must(t, "reconcile with libvirtd "+why)
		took := time.Since(start)
		t.Logf("reconcile with libvirtd %s answered in %v:\n%s", why, took.Round(10*time.Millisecond), r.out)
		if took > reconcilePrompt {
			t.Fatalf("reconcile with libvirtd %s took %v: it waited for libvirt", why, took)
		}
		if !strings.Contains(r.out, "1 pending") || !strings.Contains(r.out, "pending libvirt: ") ||
			!strings.Contains(r.out, "attachments are checked when libvirtd answers again") {
			t.Fatalf("reconcile with libvirtd %s does not report the libvirt pass pending:\n%s", why, r.out)
		}
		if r := d.ctl(t, "list").must(t, "list"); !strings.Contains(r.out, vm.Name) {
			t.Fatalf("the attachment was dropped while libvirtd was %s:\n%s", why, r.out)
		}
	}
	waitClean := func() {
		t.Helper()
		testenv.WaitFor(t, "a reconcile with nothing pending once libvirtd is back", 60*time.Second, func() bool {
			r := d.ctl(t, "reconcile")
			return r.code == 0 && strings.Contains(r.out, " 0 pending")
		})
	}

	lv.StopDaemon(t)
	reconcileDown("stopped")
	lv.StartDaemon(t)
	waitClean()

	resume := lv.Pause(t)
	reconcileDown("hung")
	resume()
	waitClean()
}
