package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/config"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/health"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// TestNotifyReadyAfterReconcile: records whose devices a reboot took are
// re-created before READY=1, so that libvirtd (ordered after vgpud)
// finds them when it autostarts VMs. The reconcile is slowed down so
// that an early READY would be seen.
func TestNotifyReadyAfterReconcile(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir, "")
	h := openSimHost(t, cfg)
	t.Setenv("NOTIFY_SOCKET", "")
	first := launch(t, cfg, nil, false)
	first.waitStarted()
	simhost.DefineTenant(t, first.d.mgr, "acme")
	mig := simhost.MustCreate(t, first.d.mgr, "acme", "3g.40gb", sim.DefaultH100MIG)
	vgpu := simhost.MustCreate(t, first.d.mgr, "acme", "L4-4Q", sim.DefaultL4)
	if err := first.shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := h.Reboot(); err != nil {
		t.Fatal(err)
	}
	if err := h.AddFault(sim.Fault{Op: "CreateGpuInstanceWithPlacement", Delay: "500ms", Count: 1}); err != nil {
		t.Fatal(err)
	}

	notify := listenNotify(t)
	// At the moment READY=1 arrives, what does the host hold?
	notify.OnMsg(func(m testenv.NotifyMsg) string {
		if !m.Has("READY=1") {
			return ""
		}
		s, _ := h.Summary()
		return s
	})
	start := time.Now()
	second := launch(t, cfg, nil, true)
	ready, ri := notify.Await("READY=1", 0, 30*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
	t.Logf("READY=1 after %v: %q", ready.At.Sub(start).Round(time.Millisecond), ready.Fields["STATUS"])
	line := simhost.SummaryLine(ready.Snap, sim.DefaultH100MIG)
	if !strings.Contains(line, "gi") || !strings.Contains(line, "ci=1") || !strings.Contains(simhost.SummaryLine(ready.Snap, sim.DefaultL4), "vf") {
		t.Fatalf("READY=1 came before reconcile re-created the instances; host then:\n%s", ready.Snap)
	}
	var statuses []string
	for _, m := range notify.Between(0, ri) {
		if s, ok := m.Fields["STATUS"]; ok {
			statuses = append(statuses, s)
		}
	}
	if strings.Join(statuses, "|") != "opening state|reconciling" {
		t.Fatalf("STATUS before READY: %q, want opening state, reconciling", statuses)
	}
	if ready.Fields["STATUS"] != "4 GPUs, 2 instances" {
		t.Fatalf("READY status %q", ready.Fields["STATUS"])
	}
	second.waitStarted()
	states := simhost.InstanceStates(t, second.d.mgr)
	if states[mig.UUID] != store.StateReady || states[vgpu.UUID] != store.StateReady {
		t.Fatalf("records after start: %v", states)
	}
}

// TestNotifyWatchdog: with WATCHDOG_USEC set, the main loop pings at half
// the interval, so one late tick does not get the daemon killed.
func TestNotifyWatchdog(t *testing.T) {
	const usec = 400_000
	notify := listenNotify(t)
	t.Setenv("WATCHDOG_USEC", fmt.Sprint(usec))
	cfg := testConfig(t, t.TempDir(), "")
	launch(t, cfg, nil, true)
	_, ri := notify.Await("READY=1", 0, 30*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
	const want = 12
	_, last := notify.Await(fmt.Sprintf("%d watchdog pings", want), 0, 10*time.Second, func() func(testenv.NotifyMsg) bool {
		n := 0
		return func(m testenv.NotifyMsg) bool {
			if m.Has("WATCHDOG=1") {
				n++
			}
			return n == want
		}
	}())
	var pings []time.Time
	for _, m := range notify.Between(ri, last+1) {
		if m.Has("WATCHDOG=1") {
			pings = append(pings, m.At)
		}
	}
	var gaps []time.Duration
	for i := 1; i < len(pings); i++ {
		gaps = append(gaps, pings[i].Sub(pings[i-1]))
	}
	sort.Slice(gaps, func(i, j int) bool { return gaps[i] < gaps[j] })
	interval := time.Duration(usec) * time.Microsecond
	median, worst := gaps[len(gaps)/2], gaps[len(gaps)-1]
	t.Logf("WATCHDOG_USEC=%v: %d pings, median gap %v, worst %v", interval, len(pings), median.Round(time.Millisecond), worst.Round(time.Millisecond))
	if median < interval*4/10 || median > interval*6/10 {
		t.Fatalf("median ping gap %v, want about %v (half the interval)", median, interval/2)
	}
	if worst >= interval {
		t.Fatalf("a gap of %v would have tripped the %v watchdog", worst, interval)
	}
}

// TestNotifyStopFinishesOperationInFlight: SIGTERM while a create is in
// the driver. STOPPING=1 goes out at once, new operations are refused
// with ErrBusy, the create finishes and is recorded, and the daemon exits
// cleanly as soon as it has, well within the stop timeout.
func TestNotifyStopFinishesOperationInFlight(t *testing.T) {
	notify := listenNotify(t)
	cfg := testConfig(t, t.TempDir(), "")
	sigCtx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stopSignals()
	td := launch(t, cfg, sigCtx, true)
	notify.Await("READY=1", 0, 30*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
	td.waitStarted()
	// The daemon's own handle on the simulated host (see TestFaultWatchWiring).
	h := td.d.host.sim
	m := td.d.mgr
	simhost.DefineTenant(t, m, "acme")
	const slow = 2 * time.Second
	if err := h.AddFault(sim.Fault{Op: "CreateGpuInstanceWithPlacement", Delay: slow.String(), Count: 1}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		rec  store.Instance
		err  error
		done time.Time
	}
	created := make(chan result, 1)
	go func() {
		// The transport gives an operation its own context: SIGTERM does
		// not cancel it.
		r, err := m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "7g.80gb", GPU: sim.DefaultH100MIG})
		created <- result{r, err, time.Now()}
	}()
	testenv.WaitFor(t, "the create to be in the driver", 10*time.Second, func() bool {
		s, _ := h.Summary()
		return strings.Contains(simhost.SummaryLine(s, sim.DefaultH100MIG), " gi")
	})
	sent := time.Now()
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopping, _ := notify.Await("STOPPING=1", 0, 5*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("STOPPING=1") })
	// No new operation once stopping (the request is one that would fail
	// harmlessly if it were admitted, so the check cannot disturb the host).
	refused := false
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		_, err := m.Create(context.Background(), manager.CreateRequest{Tenant: "no such tenant!", Profile: "7g.80gb"})
		if errors.Is(err, manager.ErrBusy) && strings.Contains(err.Error(), "shutting down") {
			refused = true
			break
		}
	}
	if !refused {
		t.Fatal("a new operation was accepted after STOPPING=1")
	}
	var res result
	select {
	case res = <-created:
	case <-time.After(30 * time.Second):
		t.Fatal("the in-flight create did not finish")
	}
	if res.err != nil {
		t.Fatalf("in-flight create: %v", res.err)
	}
	var runErr error
	select {
	case runErr = <-td.done:
	case <-time.After(stopTimeout):
		t.Fatal("the daemon did not exit")
	}
	exited := time.Now()
	td.closed = true
	td.d.close()
	if runErr != nil {
		t.Fatalf("run returned %v, want a clean exit", runErr)
	}
	if !stopping.At.Before(res.done) || res.done.After(exited) {
		t.Fatalf("order: STOPPING %v, create done %v, exit %v", stopping.At, res.done, exited)
	}
	t.Logf("SIGTERM → STOPPING=1 %v, → create finished %v, → exit %v (stop timeout %v)",
		stopping.At.Sub(sent).Round(time.Millisecond), res.done.Sub(sent).Round(time.Millisecond), exited.Sub(sent).Round(time.Millisecond), stopTimeout)
	if res.rec.State != store.StateReady {
		t.Fatalf("created record %+v", res.rec)
	}
	if s, _ := openSimHost(t, cfg).Summary(); !strings.Contains(simhost.SummaryLine(s, sim.DefaultH100MIG), "ci=1") {
		t.Fatalf("host after the stop: %s", s)
	}
	// The record is on disk: a new start finds it ready without re-creating.
	again := launch(t, cfg, nil, false)
	again.waitStarted()
	if st := simhost.InstanceStates(t, again.d.mgr)[res.rec.UUID]; st != store.StateReady {
		t.Fatalf("after restart the record is %q", st)
	}
}

// TestNotifyUnitMatchesDaemon ties the unit's timeouts to the daemon's:
// systemd must not kill a stop that is still within stopTimeout, and the
// watchdog must leave room for the ping interval.
func TestNotifyUnitMatchesDaemon(t *testing.T) {
	f, err := os.Open("../../systemd/vgpud.service")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	unit := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			unit[k] = v
		}
	}
	dur := func(k string) time.Duration {
		d, err := time.ParseDuration(strings.ReplaceAll(strings.ReplaceAll(unit[k], "min", "m"), " ", ""))
		if err != nil {
			t.Fatalf("%s=%q: %v", k, unit[k], err)
		}
		return d
	}
	if unit["Type"] != "notify" || unit["NotifyAccess"] != "main" {
		t.Fatalf("Type=%s NotifyAccess=%s, want notify and main", unit["Type"], unit["NotifyAccess"])
	}
	if stop := dur("TimeoutStopSec"); stop < stopTimeout+15*time.Second {
		t.Fatalf("TimeoutStopSec=%v leaves no room after the daemon's own %v stop timeout", stop, stopTimeout)
	}
	if wd := dur("WatchdogSec"); wd < 10*time.Second {
		t.Fatalf("WatchdogSec=%v is shorter than a slow reload or catalog read", wd)
	}
	if start := dur("TimeoutStartSec"); start < config.Default().DriverWait.Duration+health.StartMargin/2 {
		t.Fatalf("TimeoutStartSec=%v does not cover the default driver wait %v (EXTEND_TIMEOUT_USEC covers longer ones)", start, config.Default().DriverWait.Duration)
	}
}
