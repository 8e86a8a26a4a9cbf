package container

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestStartReturnsAfterReady: Type=notify is in force: systemd logs the
// unit as started only after vgpud's start-up reconcile (READY=1 is sent
// after it), `systemctl start` returns with the unit active, and vgpuctl
// is answered at once.
func TestStartReturnsAfterReady(t *testing.T) {
	must(t, "systemctl stop vgpud.service")
	cursor := journalCursor(t)
	must(t, "systemctl start vgpud.service")
	if s := prop(t, "ActiveState") + "/" + prop(t, "SubState"); s != "active/running" {
		t.Fatalf("after systemctl start returned, vgpud is %s", s)
	}
	mustCtl(t, "gpus")
	j := journalAfter(t, cursor)
	reconciled := strings.Index(j, "start-up reconcile done")
	started := strings.Index(j, "Started vgpud")
	if reconciled < 0 || started < 0 {
		t.Fatalf("journal lacks the reconcile or systemd's Started line:\n%s", j)
	}
	if started < reconciled {
		t.Fatalf("systemd considered vgpud started before its start-up reconcile was done (READY=1 not waited for):\n%s", j)
	}
	enter, _ := strconv.ParseUint(prop(t, "ActiveEnterTimestampMonotonic"), 10, 64)
	exec, _ := strconv.ParseUint(prop(t, "ExecMainStartTimestampMonotonic"), 10, 64)
	t.Logf("exec to READY: %v", time.Duration(enter-exec)*time.Microsecond)
}

// TestStatusShowsStatusText: STATUS= reaches systemctl status.
func TestStatusShowsStatusText(t *testing.T) {
	startVgpud(t)
	text := prop(t, "StatusText")
	if !strings.Contains(text, "GPUs") {
		t.Fatalf("StatusText = %q, want vgpud's summary (N GPUs, M instances)", text)
	}
	out, _ := ct.sh(t.Context(), "systemctl status --no-pager vgpud.service")
	if !strings.Contains(out, `Status: "`+text+`"`) {
		t.Fatalf("systemctl status does not show the STATUS text %q:\n%s", text, out)
	}
}

// TestReload: systemctl reload (SIGHUP) applies a changed vgpud.yaml; a
// broken one is refused, the unit stays up and the running settings are
// kept (a reload of the good file afterwards finds nothing to apply).
func TestReload(t *testing.T) {
	startVgpud(t)
	const conf = "/etc/vgpud/vgpud.yaml"
	must(t, "cp "+conf+" /root/vgpud.yaml.orig")
	t.Cleanup(func() {
		must(t, "cp /root/vgpud.yaml.orig "+conf+" && systemctl reload vgpud.service")
	})
	pid := prop(t, "MainPID")
	reload := func(want string) string {
		t.Helper()
		cursor := journalCursor(t)
		must(t, "systemctl reload vgpud.service")
		var j string
		waitFor(t, quote(want)+" in the journal", 30*time.Second, func() bool {
			j = journalAfter(t, cursor)
			return strings.Contains(j, want)
		})
		waitFor(t, "the reload to end", 30*time.Second, func() bool { return prop(t, "SubState") == "running" })
		if got := prop(t, "MainPID"); got != pid {
			t.Fatalf("reload restarted vgpud (pid %s, was %s)", got, pid)
		}
		return j
	}

	must(t, "sed -i 's/^logLevel: .*/logLevel: debug/' "+conf)
	if j := reload("configuration reloaded"); !strings.Contains(j, "logLevel") {
		t.Fatalf("reload did not apply logLevel:\n%s", j)
	}

	must(t, "sed -i 's/^ueventSettle: .*/ueventSettle: 1ms/' "+conf)
	j := reload("reload refused")
	if !strings.Contains(j, "ueventSettle") {
		t.Errorf("the refusal does not name the key:\n%s", j)
	}
	if s := prop(t, "ActiveState"); s != "active" {
		t.Fatalf("after a refused reload vgpud is %s", s)
	}

	// The good file again: logLevel debug is what runs, so nothing applies.
	must(t, "sed -i 's/^ueventSettle: .*/ueventSettle: 500ms/' "+conf)
	if j := reload("configuration reloaded"); strings.Contains(j, "logLevel") {
		t.Fatalf("the refused reload changed the running settings; the next reload applied logLevel again:\n%s", j)
	}
}

// TestStopWithOperationInFlight: systemctl stop while a create is in
// flight (its NVML call held 6 s): STOPPING with its status, the create
// finishes and is answered, vgpud exits 0 well within TimeoutStopSec, and
// after the next start the record is there, ready, with no intent left.
func TestStopWithOperationInFlight(t *testing.T) {
	startVgpud(t)
	ensureTenant(t, "ct-stop")
	must(t, "vgpud sim fault --op CreateGpuInstanceWithPlacement --delay 6s --count 1")
	t.Cleanup(func() { must(t, "vgpud sim fault-clear") })

	var wg sync.WaitGroup
	var res ctlResult
	wg.Add(1)
	go func() {
		defer wg.Done()
		res = ctl("", "-o", "json", "create", "1g.10gb", "--tenant", "ct-stop")
	}()
	waitFor(t, "the create to be in flight", 20*time.Second, func() bool {
		for _, in := range instances(t) {
			if in.Tenant == "ct-stop" && in.State == "creating" {
				return true
			}
		}
		return false
	})

	var stopping string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-done:
				return
			default:
			}
			if st, _ := ct.sh(t.Context(), "systemctl show -p StatusText --value vgpud.service"); strings.HasPrefix(st, "stopping") {
				stopping = strings.TrimSpace(st)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	start := time.Now()
	must(t, "systemctl stop vgpud.service")
	took := time.Since(start)
	<-done
	wg.Wait()
	t.Logf("stop took %v; the create answered: %v %s", took, res.err, res.out)
	if stopping == "" {
		t.Error("systemctl show never gave the STOPPING status text while vgpud stopped")
	}
	if took > 60*time.Second {
		t.Errorf("stop took %v; the in-flight create needed 6 s", took)
	}
	if r := prop(t, "Result"); r != "success" {
		t.Errorf("unit result after stop: %s (exit status %s)", r, prop(t, "ExecMainStatus"))
	}
	if res.err != nil {
		t.Errorf("the in-flight create was not finished: %v\n%s", res.err, res.out)
	}

	startVgpud(t)
	recs := checkConsistent(t)
	found := false
	for _, in := range recs {
		found = found || in.Tenant == "ct-stop"
	}
	if res.err == nil && !found {
		t.Error("the acknowledged create has no record after the restart")
	}
}

// TestWatchdogRestarts: a stopped (hung) daemon stops pinging; systemd
// aborts it after WatchdogSec (6 s in the test's drop-in, 30 s shipped)
// and restarts it (Restart=on-failure). Every instance is there afterwards
// and no intent is left.
func TestWatchdogRestarts(t *testing.T) {
	startVgpud(t)
	ensureTenant(t, "ct-watchdog")
	ids := []string{create(t, "1g.10gb", "ct-watchdog"), create(t, "1g.10gb", "ct-watchdog")}
	pid := prop(t, "MainPID")
	restarts := prop(t, "NRestarts")
	cursor := journalCursor(t)
	start := time.Now()
	must(t, "kill -STOP "+pid)
	waitFor(t, "systemd to restart vgpud", 150*time.Second, func() bool {
		p := prop(t, "MainPID")
		return p != pid && p != "0" && prop(t, "ActiveState") == "active"
	})
	took := time.Since(start)
	t.Logf("SIGSTOP to restarted and ready: %v", took)
	if took < 6*time.Second {
		t.Errorf("restarted after %v, before WatchdogSec (6 s)", took)
	}
	j := journalAfter(t, cursor)
	if !strings.Contains(j, "Watchdog timeout") {
		t.Errorf("journal lacks systemd's watchdog timeout:\n%s", j)
	}
	n0, _ := strconv.Atoi(restarts)
	if n, _ := strconv.Atoi(prop(t, "NRestarts")); n != n0+1 {
		t.Errorf("NRestarts %d, was %d", n, n0)
	}
	have := map[string]string{}
	for _, in := range instances(t) {
		have[in.UUID] = in.State
	}
	for _, id := range ids {
		if have[id] != "ready" {
			t.Errorf("instance %s after the restart: %q", id, have[id])
		}
	}
	checkConsistent(t)
}
