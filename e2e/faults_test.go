package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
	"github.com/vgpud/vgpud/internal/testenv/libvirtd"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/virt"
)

// Host faults against the built daemon on the simulated host: the driver
// absent at start, a GPU falling off the bus under instances attached to a
// VM, and a uevent storm. The daemon's records are read after it exits
// (it holds the store's lock while it runs); while it runs, what it says
// to systemd (STATUS=, WATCHDOG=1) and its log are what is watched.

// statusIs waits for a STATUS= line satisfying pred.
func statusIs(t *testing.T, p *daemonProc, from int, what string, pred func(string) bool) (testenv.NotifyMsg, int) {
	t.Helper()
	return p.notify.Await("STATUS "+what, from, 30*time.Second, func(m testenv.NotifyMsg) bool {
		s, ok := m.Fields["STATUS"]
		return ok && pred(s)
	})
}

// TestFaultsDriverAbsentThenAppears: no driver at start; after driverWait
// the daemon is READY but degraded, says so, and leaves degraded mode by
// itself when the driver loads.
func TestFaultsDriverAbsentThenAppears(t *testing.T) {
	state := t.TempDir()
	h := openSim(t, state)
	if err := h.SetDriverLoaded(false); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p := startVgpud(t, state, nil, "--driver-wait", "2s")
	_, wi := statusIs(t, p, 0, "waiting for the driver", func(s string) bool { return s == "waiting for the NVIDIA driver" })
	p.notify.Await("EXTEND_TIMEOUT_USEC", wi, 10*time.Second, func(m testenv.NotifyMsg) bool { return m.Fields["EXTEND_TIMEOUT_USEC"] != "" })
	ready, ri := p.notify.Await("READY=1", wi, 30*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
	t.Logf("READY=1 after %v: %q", ready.At.Sub(start).Round(time.Millisecond), ready.Fields["STATUS"])
	if !strings.Contains(ready.Fields["STATUS"], "degraded: NVIDIA driver not ready after 2s") {
		t.Fatalf("READY status %q does not say degraded", ready.Fields["STATUS"])
	}
	loaded := time.Now()
	if err := h.SetDriverLoaded(true); err != nil {
		t.Fatal(err)
	}
	back, _ := statusIs(t, p, ri, "without degraded", func(s string) bool { return s == "4 GPUs, 0 instances" })
	t.Logf("driver loaded: healthy STATUS after %v", back.At.Sub(loaded).Round(time.Millisecond))
	if !strings.Contains(p.logs.String(), "NVIDIA driver appeared: leaving degraded mode") {
		t.Fatal("no log line for leaving degraded mode")
	}
	p.signal(syscall.SIGTERM)
	if err := p.wait(t, 90*time.Second); err != nil {
		t.Fatalf("exit: %v", err)
	}
}

// TestFaultsXID79WithAttachedInstances: a GPU whose vGPUs are attached to
// a VM falls off the bus. The daemon marks it and its instances lost (the
// records say so after it stops, and the attachments are kept), it keeps
// serving, and when the GPU is back (here after a daemon restart, so the
// lost state also survives one) it re-creates the vGPUs on the VFs the
// VM's definition names.
func TestFaultsXID79WithAttachedInstances(t *testing.T) {
	lv := libvirtd.Start(t)
	const vm = "vgpud-e2e-faults-vm"
	lv.DefineDomain(t, vm)
	state := t.TempDir()
	ctx := context.Background()
	vc, err := virt.Connect(ctx, virt.Config{Socket: lv.Socket(), URI: lv.URI()})
	if err != nil {
		t.Fatal(err)
	}
	var attached []store.Instance
	var control store.Instance
	seed(t, state, vc, func(m *manager.Manager, _ *sim.Host) {
		for i := 0; i < 2; i++ {
			r, err := m.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "L4-4Q", GPU: sim.DefaultL4})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.Attach(ctx, r.UUID, vm, manager.AttachOptions{}); err != nil {
				t.Fatal(err)
			}
			attached = append(attached, r)
		}
		r, err := m.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "H100XM-4C", GPU: sim.DefaultH100TS})
		if err != nil {
			t.Fatal(err)
		}
		control = r
	})
	vc.Close()
	h := openSim(t, state)
	args := []string{"--libvirt-socket", lv.Socket(), "--libvirt-uri", lv.URI()}

	p := startVgpud(t, state, nil, args...)
	_, ri := p.notify.Await("READY=1", 0, 60*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
	lost := time.Now()
	if err := h.LoseGPU(sim.DefaultL4); err != nil {
		t.Fatal(err)
	}
	m, _ := statusIs(t, p, ri, "with a lost GPU", func(s string) bool { return strings.Contains(s, "1 GPUs lost or failed") })
	t.Logf("XID 79: STATUS %q after %v", m.Fields["STATUS"], m.At.Sub(lost).Round(time.Millisecond))
	// The log arrives through a pipe; STATUS may overtake it.
	logs := p.awaitLog(t, "lost=2")
	// The XID names the GPU; when the GPU was lost before the event loop
	// had registered it, the loss is reported without one.
	for _, want := range []string{`msg="GPU failed: new carving there is refused"`, "gpu=" + sim.DefaultL4, "lost=2"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q", want)
		}
	}
	if !strings.Contains(logs, "XID 79 (GPU has fallen off the bus)") && !strings.Contains(logs, "NVML answers GPU_IS_LOST") {
		t.Error("log does not say why the GPU failed")
	}
	p.signal(syscall.SIGTERM)
	if err := p.wait(t, 90*time.Second); err != nil {
		t.Fatalf("exit: %v", err)
	}
	recs := records(t, state)
	for _, r := range attached {
		if recs[r.UUID].State != store.StateLost {
			t.Fatalf("attached instance %s on the lost GPU is %q, want lost", r.UUID, recs[r.UUID].State)
		}
	}
	if recs[control.UUID].State != store.StateReady {
		t.Fatalf("instance on a healthy GPU is %q", recs[control.UUID].State)
	}
	checkAttachments(t, state, lv, vm, attached)

	// Restart with the GPU still lost, then bring it back.
	p = startVgpud(t, state, nil, args...)
	_, ri = p.notify.Await("READY=1", 0, 60*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
	if s := p.notify.Between(ri, ri+1)[0].Fields["STATUS"]; !strings.Contains(s, "1 GPUs lost or failed") {
		t.Fatalf("after restart STATUS %q, want the GPU still lost", s)
	}
	back := time.Now()
	if err := h.RecoverGPU(sim.DefaultL4); err != nil {
		t.Fatal(err)
	}
	m, _ = statusIs(t, p, ri, "healthy again", func(s string) bool { return s == "4 GPUs, 3 instances" })
	t.Logf("GPU back: STATUS %q after %v", m.Fields["STATUS"], m.At.Sub(back).Round(time.Millisecond))
	if n := len(regexp.MustCompile(`vf[0-9a-f:.]+=t[0-9]+`).FindAllString(gpuLine(h, sim.DefaultL4), -1)); n != 2 {
		t.Fatalf("vGPUs on the recovered GPU: %s", gpuLine(h, sim.DefaultL4))
	}
	p.signal(syscall.SIGTERM)
	if err := p.wait(t, 90*time.Second); err != nil {
		t.Fatalf("exit: %v", err)
	}
	recs = records(t, state)
	for _, r := range append(attached, control) {
		if recs[r.UUID].State != store.StateReady {
			t.Fatalf("instance %s after recovery: %q", r.UUID, recs[r.UUID].State)
		}
	}
	checkAttachments(t, state, lv, vm, attached)
}

// checkAttachments: the attachment records are kept and the VM's
// definition holds each instance's VF.
func checkAttachments(t *testing.T, state string, lv *libvirtd.Env, vm string, want []store.Instance) {
	t.Helper()
	db, err := store.Open(state+"/state.db", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	atts := map[string]store.Attachment{}
	recs := map[string]store.Instance{}
	err = db.View(func(tx *store.Tx) error {
		as, err := tx.Attachments()
		for _, a := range as {
			atts[a.Instance] = a
		}
		if err != nil {
			return err
		}
		rs, err := tx.Instances()
		for _, r := range rs {
			recs[r.UUID] = r
		}
		return err
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	xml := lv.Virsh(t, "dumpxml", "--inactive", vm)
	for _, r := range want {
		if atts[r.UUID].Domain != vm {
			t.Errorf("attachment of %s: %+v", r.UUID, atts[r.UUID])
		}
		vf := strings.Split(recs[r.UUID].VF, ":")
		if len(vf) != 3 {
			t.Fatalf("record %s has VF %q", r.UUID, recs[r.UUID].VF)
		}
		if addr := fmt.Sprintf("bus='0x%s' slot='0x%s' function='0x%s'", vf[1], vf[2][:2], vf[2][3:]); !strings.Contains(xml, addr) {
			t.Errorf("VM definition lacks %s's VF (%s):\n%s", r.UUID, addr, xml)
		}
	}
}

// TestFaultsUeventStorm: 1000 uevents while the daemon runs with a 1 s
// watchdog. The main loop keeps pinging on time throughout (the storm is
// handled off it), the events cause a handful of reconciles, and the
// records are unchanged after.
func TestFaultsUeventStorm(t *testing.T) {
	state := t.TempDir()
	var ids []string
	seed(t, state, nil, func(m *manager.Manager, _ *sim.Host) {
		for _, p := range []string{"L4-4Q", "A10-4Q", "2g.20gb"} {
			r, err := m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: p})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, r.UUID)
		}
	})
	h := openSim(t, state)
	const watchdog = time.Second
	p := startVgpud(t, state, []string{fmt.Sprintf("WATCHDOG_USEC=%d", watchdog.Microseconds())})
	_, ri := p.notify.Await("READY=1", 0, 60*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
	const storm = 1000
	start := time.Now()
	for i := 0; i < storm; i++ {
		var err error
		switch i % 3 {
		case 0:
			err = h.EmitUevent("change", "devices/pci0000:00/0000:81:00."+fmt.Sprint(4+i%4), "pci", map[string]string{"NVIDIA_VGPU_TYPE": "0"})
		case 1:
			err = h.EmitUevent("remove", fmt.Sprintf("devices/pci0000:00/%s/00000000-0000-4000-8000-%012d", sim.DefaultA10, i), "mdev", nil)
		default:
			err = h.EmitUevent("add", "devices/pci0000:00/0000:c1:00."+fmt.Sprint(i%8), "pci", map[string]string{"PCI_ID": "10DE:2330"})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	emitted := time.Since(start)
	// The last reconcile names the storm's events; wait until their count
	// is all in.
	deadline := time.Now().Add(60 * time.Second)
	seen := 0
	for {
		seen = 0
		for _, l := range strings.Split(p.logs.String(), "\n") {
			if strings.Contains(l, `msg="host changed: reconciled"`) {
				if i := strings.Index(l, " events="); i >= 0 {
					var n int
					fmt.Sscanf(l[i+len(" events="):], "%d", &n)
					seen += n
				}
			}
		}
		if seen >= storm || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // the daemon's log is the only signal
	}
	done := time.Now()
	reconciles := strings.Count(p.logs.String(), `msg="host changed: reconciled"`)
	var pings []time.Time
	for _, m := range p.notify.Between(ri, p.notify.Count()) {
		if m.Has("WATCHDOG=1") {
			pings = append(pings, m.At)
		}
	}
	var worst time.Duration
	for i := 1; i < len(pings); i++ {
		worst = max(worst, pings[i].Sub(pings[i-1]))
	}
	t.Logf("storm: %d uevents emitted in %v, %d handled by %d reconciles, done %v after the last; %d watchdog pings, worst gap %v",
		storm, emitted.Round(time.Millisecond), seen, reconciles, done.Sub(start.Add(emitted)).Round(time.Millisecond), len(pings), worst.Round(time.Millisecond))
	if seen < storm {
		t.Fatalf("only %d of %d uevents were handled", seen, storm)
	}
	// Batching, not timing: a slow emitter (fsync per simulated uevent on a
	// loaded machine) leaves quiet gaps that each end a batch, so the bound
	// is on events per reconcile.
	if reconciles > storm/20 {
		t.Fatalf("%d reconciles for %d uevents over %v: not batched", reconciles, storm, emitted)
	}
	if worst >= watchdog {
		t.Fatalf("watchdog gap %v during the storm (WatchdogSec %v)", worst, watchdog)
	}
	p.signal(syscall.SIGTERM)
	if err := p.wait(t, 90*time.Second); err != nil {
		t.Fatalf("exit: %v", err)
	}
	recs := records(t, state)
	if len(recs) != len(ids) {
		t.Fatalf("%d records after the storm, want %d", len(recs), len(ids))
	}
	for _, id := range ids {
		if recs[id].State != store.StateReady {
			t.Fatalf("instance %s after the storm: %q", id, recs[id].State)
		}
	}
}
