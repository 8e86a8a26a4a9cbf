package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
	"github.com/vgpud/vgpud/pkg/uevent"
)

// The built-in simulated host (pkg/gpu/sim DefaultSpec).
const (
	simH100MIG = "0000:41:00.0" // H100, MIG on, vendor VFIO
	simH100TS  = "0000:61:00.0" // H100, time-sliced vGPUs on VFs
	simL4      = "0000:81:00.0"
	simA10     = "0000:a1:00.0" // legacy mdev on VFs
)

// ---- test harness: a daemon in this process, wired as serve() wires it ----

// syncBuf collects log output from several goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testConfig builds a configuration the way main does: flags over a file.
// yaml is the file's content; "" means short fault timings, set in the
// file (not as flags) so that a reload can change them.
func testConfig(t *testing.T, stateDir, yaml string, args ...string) *Config {
	t.Helper()
	if yaml == "" {
		yaml = "ueventSettle: 50ms\nrecoverProbe: 100ms\n"
	}
	file := filepath.Join(t.TempDir(), "vgpud.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := defaultConfig()
	fs := pflag.NewFlagSet("vgpud", pflag.ContinueOnError)
	cfg.bindFlags(fs)
	base := []string{"--config", file, "--state-dir", stateDir, "--sim", "--metrics-listen", "", "--libvirt-socket", "",
		"--profiles-dir", "", "--driver-wait", "2s", "--log-level", "debug"}
	if err := fs.Parse(append(base, args...)); err != nil {
		t.Fatal(err)
	}
	if err := cfg.load(fs); err != nil {
		t.Fatalf("load configuration: %v", err)
	}
	return cfg
}

// testDaemon is a daemon started in-process.
type testDaemon struct {
	t    *testing.T
	d    *daemon
	logs *syncBuf
	ctx  context.Context
	stop context.CancelFunc
	// started is closed when start returned (startErr holds its error);
	// done receives run's result.
	started  chan struct{}
	startErr error
	done     chan error
	closed   bool
}

// openSimHost opens (creating) the simulated host in the state dir, as a
// second process would: the daemon and the test share it by its lock.
func openSimHost(t *testing.T, cfg *Config) *sim.Host {
	t.Helper()
	cat, err := loadCatalog(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h, err := openSim(cfg, cat, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// launch starts the daemon: start (driver wait, reconcile) then, when
// run is set, the main loop (notify, watchdog, signals, fault watch).
// ctx nil means a context the harness cancels at cleanup.
func launch(t *testing.T, cfg *Config, ctx context.Context, run bool) *testDaemon {
	t.Helper()
	logs := &syncBuf{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	td := &testDaemon{t: t, logs: logs, started: make(chan struct{}), done: make(chan error, 1)}
	if ctx == nil {
		ctx = context.Background()
	}
	td.ctx, td.stop = context.WithCancel(ctx)
	td.d = &daemon{cfg: cfg, log: log, notify: newNotifier(log)}
	go func() {
		td.startErr = td.d.start(td.ctx)
		close(td.started)
		if td.startErr != nil || !run {
			td.done <- td.startErr
			return
		}
		td.done <- td.d.run(td.ctx)
	}()
	t.Cleanup(func() {
		td.shutdown()
		if t.Failed() {
			t.Logf("daemon log:\n%s", logs.String())
		}
	})
	return td
}

// waitStarted waits for start to return and fails the test on its error.
func (td *testDaemon) waitStarted() {
	td.t.Helper()
	select {
	case <-td.started:
	case <-time.After(30 * time.Second):
		td.t.Fatal("daemon start did not return")
	}
	if td.startErr != nil {
		td.t.Fatalf("daemon start: %v", td.startErr)
	}
}

// shutdown stops the daemon (as SIGTERM does) and releases its files.
func (td *testDaemon) shutdown() error {
	if td.closed {
		return nil
	}
	td.closed = true
	td.stop()
	var err error
	select {
	case err = <-td.done:
	case <-time.After(90 * time.Second):
		err = errors.New("daemon did not stop")
	}
	td.d.close()
	return err
}

// waitFor polls cond (state that no event announces) until it holds.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func defineTenant(t *testing.T, m *manager.Manager, name string) {
	t.Helper()
	if _, err := m.DefineTenant(context.Background(), tenant.Tenant{Name: name, Quota: tenant.UnlimitedQuota()}); err != nil {
		t.Fatal(err)
	}
}

func mustCreate(t *testing.T, m *manager.Manager, profile, gpu string) store.Instance {
	t.Helper()
	r, err := m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: profile, GPU: gpu})
	if err != nil {
		t.Fatalf("create %s on %s: %v", profile, gpu, err)
	}
	return r
}

func instanceStates(t *testing.T, m *manager.Manager) map[string]store.InstanceState {
	t.Helper()
	views, err := m.AllInstances()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]store.InstanceState{}
	for _, v := range views {
		out[v.UUID] = v.State
	}
	return out
}

func gpuState(t *testing.T, m *manager.Manager, pci string) manager.GPUView {
	t.Helper()
	v, err := m.GPU(pci)
	if err != nil {
		t.Fatalf("GPU %s: %v", pci, err)
	}
	return v
}

// notifyListener is the systemd side of $NOTIFY_SOCKET.
type notifyListener struct {
	t    *testing.T
	conn *net.UnixConn

	mu   sync.Mutex
	msgs []notifyMsg
	cond chan struct{} // closed and replaced on every message
	// onMsg runs in the reader for each message, before waiters see it,
	// and its result is kept as the message's snap (a picture of the host
	// at the moment a state arrived).
	onMsg func(notifyMsg) string
}

type notifyMsg struct {
	at     time.Time
	fields map[string]string
	// snap is what onMsg returned.
	snap string
}

func (m notifyMsg) has(kv string) bool {
	k, v, _ := strings.Cut(kv, "=")
	got, ok := m.fields[k]
	return ok && got == v
}

// listenNotify opens a unixgram socket and points $NOTIFY_SOCKET at it.
func listenNotify(t *testing.T) *notifyListener {
	t.Helper()
	// Socket paths are limited to 108 bytes; test temp dirs can be longer.
	dir, err := os.MkdirTemp("", "sdn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	l := &notifyListener{t: t, conn: conn, cond: make(chan struct{})}
	t.Setenv("NOTIFY_SOCKET", path)
	go l.read()
	t.Cleanup(func() { conn.Close() })
	return l
}

func (l *notifyListener) read() {
	buf := make([]byte, 4096)
	for {
		n, err := l.conn.Read(buf)
		if err != nil {
			return
		}
		m := notifyMsg{at: time.Now(), fields: map[string]string{}}
		for _, line := range strings.Split(string(buf[:n]), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				m.fields[k] = v
			}
		}
		l.mu.Lock()
		hook := l.onMsg
		l.mu.Unlock()
		if hook != nil {
			m.snap = hook(m)
		}
		l.mu.Lock()
		l.msgs = append(l.msgs, m)
		close(l.cond)
		l.cond = make(chan struct{})
		l.mu.Unlock()
	}
}

// await returns the first message matching pred, and its index.
func (l *notifyListener) await(what string, timeout time.Duration, pred func(notifyMsg) bool) (notifyMsg, int) {
	l.t.Helper()
	return l.awaitFrom(0, what, timeout, pred)
}

// awaitFrom is await from message index from on.
func (l *notifyListener) awaitFrom(from int, what string, timeout time.Duration, pred func(notifyMsg) bool) (notifyMsg, int) {
	l.t.Helper()
	deadline := time.After(timeout)
	for i := from; ; {
		l.mu.Lock()
		for ; i < len(l.msgs); i++ {
			if pred(l.msgs[i]) {
				m := l.msgs[i]
				l.mu.Unlock()
				return m, i
			}
		}
		c := l.cond
		l.mu.Unlock()
		select {
		case <-c:
		case <-deadline:
			l.t.Fatalf("no notify message %s within %v; got %v", what, timeout, l.all())
		}
	}
}

// snapshot sets onMsg.
func (l *notifyListener) snapshot(fn func(notifyMsg) string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.onMsg = fn
}

func (l *notifyListener) all() []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]map[string]string, len(l.msgs))
	for i, m := range l.msgs {
		out[i] = m.fields
	}
	return out
}

func (l *notifyListener) since(i int) []notifyMsg {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]notifyMsg(nil), l.msgs[i:]...)
}

// watch starts a fault watcher over a started daemon, as run does, and
// returns it for its counters.
func watch(t *testing.T, td *testDaemon) *faultWatch {
	t.Helper()
	n := strings.Count(td.logs.String(), "watching NVML events")
	w := newFaultWatch(td.d)
	stop := w.start(td.ctx)
	t.Cleanup(stop)
	// The NVML event loop says when its GPUs are registered; before, an
	// XID would be missed.
	waitFor(t, "the NVML event loop", 10*time.Second, func() bool {
		return strings.Count(td.logs.String(), "watching NVML events") > n
	})
	return w
}

// events collects manager events.
func events(t *testing.T, m *manager.Manager) func(kind manager.EventKind) []manager.Event {
	ch, cancel := m.Subscribe()
	var mu sync.Mutex
	var got []manager.Event
	go func() {
		for e := range ch {
			mu.Lock()
			got = append(got, e)
			mu.Unlock()
		}
	}()
	t.Cleanup(cancel)
	return func(kind manager.EventKind) []manager.Event {
		mu.Lock()
		defer mu.Unlock()
		var out []manager.Event
		for _, e := range got {
			if e.Kind == kind {
				out = append(out, e)
			}
		}
		return out
	}
}

func simDevPath(pci string) string { return "devices/pci0000:00/" + pci }

// ---- fault tests ----

// TestFaultGPULostMidOperation: a GPU falls off the bus while vgpud
// carves on it. The operation fails with a named error, the GPU's other
// instances read lost, the daemon keeps serving on the other GPUs, no
// record is lost, and when the GPU is back its instances are re-created.
func TestFaultGPULostMidOperation(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir, "")
	td := launch(t, cfg, nil, false)
	td.waitStarted()
	// Change the host through the daemon's own handle: a change through a
	// second handle makes the daemon's handle reload state.json, which
	// races with its concurrent NVML calls inside the simulator.
	h := td.d.host.sim
	m := td.d.mgr
	w := watch(t, td)
	evs := events(t, m)
	defineTenant(t, m, "acme")
	onLost := mustCreate(t, m, "1g.10gb", simH100MIG)
	elsewhere := mustCreate(t, m, "L4-4Q", simL4)

	if err := h.AddFault(sim.Fault{Op: "CreateGpuInstanceWithPlacement", GPU: simH100MIG, Delay: "1s", Count: 1}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		rec store.Instance
		err error
	}
	inflight := make(chan result, 1)
	go func() {
		r, err := m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "2g.20gb", GPU: simH100MIG})
		inflight <- result{r, err}
	}()
	waitFor(t, "the in-flight GPU instance", 10*time.Second, func() bool {
		s, _ := h.Summary()
		return strings.Count(firstLine(s, simH100MIG), " gi") == 2
	})
	if err := h.LoseGPU(simH100MIG); err != nil {
		t.Fatal(err)
	}
	res := <-inflight
	if !errors.Is(res.err, manager.ErrGPULost) && !errors.Is(res.err, manager.ErrBackendFailure) {
		t.Fatalf("in-flight create on the lost GPU: %v, want a GPU-lost or backend failure", res.err)
	}
	waitFor(t, "the instance on the lost GPU to read lost", 10*time.Second, func() bool {
		return instanceStates(t, m)[onLost.UUID] == store.StateLost
	})
	if v := gpuState(t, m, simH100MIG); v.State != "lost" {
		t.Fatalf("GPU state %q (%s), want lost", v.State, v.Reason)
	}
	if _, err := m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "1g.10gb", GPU: simH100MIG}); !errors.Is(err, manager.ErrGPULost) {
		t.Fatalf("create on the lost GPU: %v, want ErrGPULost", err)
	}
	// Still serving: reads and carving elsewhere.
	more := mustCreate(t, m, "L4-4Q", simL4)
	states := instanceStates(t, m)
	for _, id := range []string{elsewhere.UUID, more.UUID} {
		if states[id] != store.StateReady {
			t.Fatalf("instance %s on a healthy GPU: %s", id, states[id])
		}
	}
	if xids := evs(manager.EventXID); len(xids) != 1 || xids[0].Detail != "79" || xids[0].ID != gpuState(t, m, simH100MIG).UUID {
		t.Fatalf("XID events %+v, want one XID 79 for the lost GPU", xids)
	}

	if err := h.RecoverGPU(simH100MIG); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the GPU's instance to be re-created", 10*time.Second, func() bool {
		return instanceStates(t, m)[onLost.UUID] == store.StateReady
	})
	if v := gpuState(t, m, simH100MIG); v.State != "ok" {
		t.Fatalf("GPU state after recovery %q (%s)", v.State, v.Reason)
	}
	states = instanceStates(t, m)
	for _, id := range []string{onLost.UUID, elsewhere.UUID, more.UUID} {
		if states[id] != store.StateReady {
			t.Fatalf("after recovery instance %s is %q; all: %v", id, states[id], states)
		}
	}
	if res.rec.UUID != "" {
		if _, ok := states[res.rec.UUID]; !ok {
			t.Fatalf("record of the interrupted create lost")
		}
	}
	if w.stats.Failures.Load() != 1 || w.stats.Recoveries.Load() != 1 {
		t.Fatalf("failures %d, recoveries %d, want 1 and 1", w.stats.Failures.Load(), w.stats.Recoveries.Load())
	}
	s, _ := h.Summary()
	t.Logf("after recovery: %s", firstLine(s, simH100MIG))
}

func firstLine(summary, pci string) string {
	for _, l := range strings.Split(summary, "\n") {
		if strings.HasPrefix(l, pci) {
			return l
		}
	}
	return ""
}

// TestFaultCriticalXIDOnAnsweringGPU: XID 48 on a GPU that still answers.
// The GPU reads failed with the reason, carving there is refused with a
// named error, the XID is published for metrics; it is not cleared by
// re-reading (it needs a reset), only when its PCI function is bound to
// the driver again.
func TestFaultCriticalXIDOnAnsweringGPU(t *testing.T) {
	cfg := testConfig(t, t.TempDir(), "")
	td := launch(t, cfg, nil, false)
	td.waitStarted()
	// Change the host through the daemon's own handle: a change through a
	// second handle makes the daemon's handle reload state.json, which
	// races with its concurrent NVML calls inside the simulator.
	h := td.d.host.sim
	m := td.d.mgr
	defineTenant(t, m, "acme")
	inst := mustCreate(t, m, "H100XM-4C", simH100TS)
	w := watch(t, td)
	evs := events(t, m)

	// An application fault: counted, the GPU stays in service.
	if err := h.InjectXID(simH100TS, 13, -1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "XID 13 to be published", 10*time.Second, func() bool { return len(evs(manager.EventXID)) == 1 })
	if v := gpuState(t, m, simH100TS); v.State != "ok" {
		t.Fatalf("after XID 13 the GPU is %q", v.State)
	}

	if err := h.InjectXID(simH100TS, 48, -1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the GPU to read failed", 10*time.Second, func() bool { return gpuState(t, m, simH100TS).State == "failed" })
	v := gpuState(t, m, simH100TS)
	if !strings.Contains(v.Reason, "XID 48") || !strings.Contains(v.Reason, "reset") {
		t.Fatalf("reason %q", v.Reason)
	}
	if len(v.Instances) != 1 || v.Instances[0] != inst.UUID {
		t.Fatalf("failed GPU lists instances %v, want [%s]", v.Instances, inst.UUID)
	}
	_, err := m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "H100XM-4C", GPU: simH100TS})
	if !errors.Is(err, manager.ErrNoCapacity) || !strings.Contains(err.Error(), "XID 48") {
		t.Fatalf("create on the failed GPU: %v, want ErrNoCapacity naming XID 48", err)
	}
	// Events reach the collector goroutine on their own schedule: the GPU
	// may read failed before the XID event is in the list.
	waitFor(t, "XID 48 to be published", 10*time.Second, func() bool { return len(evs(manager.EventXID)) >= 2 })
	xids := evs(manager.EventXID)
	if len(xids) != 2 || xids[1].Detail != "48" || xids[1].ID != v.UUID {
		t.Fatalf("XID events %+v", xids)
	}
	// Re-reading finds the GPU answering; that is not a reset.
	probes := w.stats.Probes.Load()
	waitFor(t, "three probes of the failed GPU", 10*time.Second, func() bool { return w.stats.Probes.Load() >= probes+3 })
	if gpuState(t, m, simH100TS).State != "failed" || w.stats.Recoveries.Load() != 0 {
		t.Fatal("an XID-failed GPU recovered without a reset")
	}
	// The reset: the PF is bound to nvidia again.
	if err := h.EmitUevent("bind", simDevPath(simH100TS), "pci", map[string]string{"DRIVER": "nvidia", "PCI_ID": "10DE:2330"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the GPU back in service", 10*time.Second, func() bool { return gpuState(t, m, simH100TS).State == "ok" })
	// Its instance was failed with the GPU; the reconcile after the reset
	// brings it back.
	waitFor(t, "the instance ready again", 10*time.Second, func() bool { return instanceStates(t, m)[inst.UUID] == store.StateReady })
	mustCreate(t, m, "H100XM-4C", simH100TS)
}

// TestFaultDriverAbsentAtStart: the driver is not loaded when vgpud
// starts. If it loads within driverWait the start goes on normally; if
// not, vgpud starts degraded (reads served, carving refused with a named
// error) and leaves degraded mode when the driver appears.
func TestFaultDriverAbsentAtStart(t *testing.T) {
	tests := []struct {
		name     string
		wait     string
		loadWhen string // "waiting": during the wait; "degraded": after the start
	}{
		{name: "appears-while-waiting", wait: "10s", loadWhen: "waiting"},
		{name: "appears-after-degraded-start", wait: "1s", loadWhen: "degraded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			notify := listenNotify(t)
			cfg := testConfig(t, t.TempDir(), "", "--driver-wait", tt.wait)
			h := openSimHost(t, cfg)
			if err := h.SetDriverLoaded(false); err != nil {
				t.Fatal(err)
			}
			td := launch(t, cfg, nil, true)
			notify.await("waiting for the driver", 10*time.Second, func(m notifyMsg) bool { return m.has("STATUS=waiting for the NVIDIA driver") })
			notify.await("EXTEND_TIMEOUT_USEC", 10*time.Second, func(m notifyMsg) bool { return m.fields["EXTEND_TIMEOUT_USEC"] != "" })
			if tt.loadWhen == "waiting" {
				if err := h.SetDriverLoaded(true); err != nil {
					t.Fatal(err)
				}
			}
			ready, _ := notify.await("READY=1", 20*time.Second, func(m notifyMsg) bool { return m.has("READY=1") })
			td.waitStarted()
			m := td.d.mgr
			degraded := strings.Contains(ready.fields["STATUS"], "degraded")
			if degraded != (tt.loadWhen == "degraded") {
				t.Fatalf("READY status %q, degraded %v", ready.fields["STATUS"], degraded)
			}
			if tt.loadWhen == "degraded" {
				if _, err := m.GPUs(); err != nil {
					t.Fatalf("reads while degraded: %v", err)
				}
				defineTenant(t, m, "acme")
				_, err := m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "L4-4Q"})
				if !errors.Is(err, manager.ErrBusy) || !strings.Contains(err.Error(), "carving is disabled") {
					t.Fatalf("create while degraded: %v, want ErrBusy (carving is disabled)", err)
				}
				// After the start, through the daemon's own handle (see
				// TestFaultGPULostMidOperation).
				if err := td.d.host.sim.SetDriverLoaded(true); err != nil {
					t.Fatal(err)
				}
				notify.await("a status without degraded", 20*time.Second, func(m notifyMsg) bool {
					s, ok := m.fields["STATUS"]
					return ok && strings.Contains(s, "GPUs") && !strings.Contains(s, "degraded")
				})
				if m.Degraded() != "" {
					t.Fatalf("still degraded: %s", m.Degraded())
				}
			} else {
				defineTenant(t, m, "acme")
			}
			mustCreate(t, m, "L4-4Q", simL4)
		})
	}
}

// TestFaultVFsLate: the NVIDIA units enable SR-IOV after vgpud started.
// Start-up waits for the VFs (bounded by driverWait) before reconcile, so
// vGPUs on them are found; VFs that never come do not fail the start.
func TestFaultVFsLate(t *testing.T) {
	tests := []struct {
		name   string
		wait   string
		enable bool
	}{
		{name: "enabled-during-the-wait", wait: "10s", enable: true},
		{name: "never-enabled", wait: "1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			notify := listenNotify(t)
			cfg := testConfig(t, t.TempDir(), "", "--driver-wait", tt.wait)
			h := openSimHost(t, cfg)
			if err := h.SetVFs(simH100TS, false); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			td := launch(t, cfg, nil, true)
			notify.await("waiting for VFs", 10*time.Second, func(m notifyMsg) bool {
				return m.has("STATUS=waiting for SR-IOV virtual functions on " + simH100TS)
			})
			if tt.enable {
				if err := h.SetVFs(simH100TS, true); err != nil {
					t.Fatal(err)
				}
			}
			notify.await("READY=1", 20*time.Second, func(m notifyMsg) bool { return m.has("READY=1") })
			td.waitStarted()
			t.Logf("start took %v", time.Since(start).Round(time.Millisecond))
			m := td.d.mgr
			if m.Degraded() != "" {
				t.Fatalf("degraded: %s", m.Degraded())
			}
			g := gpuState(t, m, simH100TS)
			if got := len(g.VGPU.VFs) > 0; got != tt.enable {
				t.Fatalf("VFs at the first reconcile: %d", len(g.VGPU.VFs))
			}
			if !tt.enable && !strings.Contains(td.logs.String(), "SR-IOV virtual functions did not appear") {
				t.Fatal("no log line naming the missing VFs")
			}
		})
	}
}

// TestFaultUeventStorm: 1000 uevents from the simulated kernel while the
// daemon serves. Every event is read, they cause a handful of re-reads,
// reads stay fast, and no record changes.
func TestFaultUeventStorm(t *testing.T) {
	cfg := testConfig(t, t.TempDir(), "")
	td := launch(t, cfg, nil, false)
	td.waitStarted()
	// Change the host through the daemon's own handle: a change through a
	// second handle makes the daemon's handle reload state.json, which
	// races with its concurrent NVML calls inside the simulator.
	h := td.d.host.sim
	m := td.d.mgr
	defineTenant(t, m, "acme")
	ids := []string{mustCreate(t, m, "1g.10gb", simH100MIG).UUID, mustCreate(t, m, "L4-4Q", simL4).UUID, mustCreate(t, m, "A10-4Q", simA10).UUID}
	// Watching starts after the creates: it sees only the storm.
	w := watch(t, td)
	before := w.stats.Uevents.Load()
	resyncsBefore := w.stats.Refreshes.Load() + w.stats.Reconciles.Load()

	const storm = 1000
	vfs := gpuState(t, m, simH100TS).VGPU.VFs
	stopReads := make(chan struct{})
	var worst time.Duration
	var reads int
	readsDone := make(chan struct{})
	go func() {
		defer close(readsDone)
		for {
			select {
			case <-stopReads:
				return
			default:
			}
			t0 := time.Now()
			if _, err := m.GPUs(); err != nil {
				t.Errorf("read during the storm: %v", err)
				return
			}
			if _, err := m.AllInstances(); err != nil {
				t.Errorf("read during the storm: %v", err)
				return
			}
			worst = max(worst, time.Since(t0))
			reads++
			time.Sleep(5 * time.Millisecond)
		}
	}()
	t0 := time.Now()
	for i := 0; i < storm; i++ {
		var err error
		switch i % 4 {
		case 0: // a VF's type written and cleared by someone else's tool
			err = h.EmitUevent("change", simDevPath(vfs[i%len(vfs)].PCI), "pci", map[string]string{"NVIDIA_VGPU_TYPE": "0"})
		case 1:
			err = h.EmitUevent("add", simDevPath(simA10)+"/"+fmt.Sprintf("00000000-0000-4000-8000-%012d", i), "mdev", nil)
		case 2: // another vendor's device: read, ignored
			err = h.EmitUevent("add", "devices/pci0000:00/0000:00:1f."+fmt.Sprint(i%8), "pci", map[string]string{"PCI_ID": "8086:A0A3"})
		default:
			err = h.EmitUevent("change", simDevPath(vfs[i%len(vfs)].PCI), "pci", map[string]string{"NVIDIA_VGPU_TYPE": "893"})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	emitted := time.Since(t0)
	waitFor(t, "every storm uevent to be read", 60*time.Second, func() bool { return w.stats.Uevents.Load()-before >= storm })
	// The last batch is handled within stormFactor settle periods.
	waitFor(t, "the storm's last re-read", 30*time.Second, func() bool {
		return len(w.uev) == 0 && w.stats.Batched.Load() == 0
	})
	close(stopReads)
	<-readsDone
	resyncs := w.stats.Refreshes.Load() + w.stats.Reconciles.Load() - resyncsBefore
	t.Logf("storm: %d uevents emitted in %v, read %d (relevant %d, overflows %d), re-reads %d (reconciles %d), %d reads during it, slowest %v",
		storm, emitted.Round(time.Millisecond), w.stats.Uevents.Load()-before, w.stats.Relevant.Load(), w.stats.Overflows.Load(),
		resyncs, w.stats.Reconciles.Load(), reads, worst.Round(time.Microsecond))
	// Batched (a bound on events per re-read, not on time: quiet gaps of a
	// slow emitter each end a batch), and the daemon kept answering reads.
	if limit := int64(storm / 20); resyncs > limit || resyncs == 0 {
		t.Fatalf("%d re-reads for %d uevents over %v, want 1..%d", resyncs, storm, emitted, limit)
	}
	if reads == 0 {
		t.Fatal("no read was answered during the storm")
	}
	states := instanceStates(t, m)
	if len(states) != len(ids) {
		t.Fatalf("records %v, want %d", states, len(ids))
	}
	for _, id := range ids {
		if states[id] != store.StateReady {
			t.Fatalf("instance %s is %s after the storm", id, states[id])
		}
	}
}

// fakeSource is a uevent Source fed by the test.
type fakeSource struct {
	ch     chan any // uevent.Event or error
	closed chan struct{}
	once   sync.Once
}

func (f *fakeSource) Next(ctx context.Context) (uevent.Event, error) {
	select {
	case <-ctx.Done():
		return uevent.Event{}, ctx.Err()
	case <-f.closed:
		return uevent.Event{}, uevent.ErrClosed
	case x := <-f.ch:
		if err, ok := x.(error); ok {
			return uevent.Event{}, err
		}
		return x.(uevent.Event), nil
	}
}

func (f *fakeSource) Close() error { f.once.Do(func() { close(f.closed) }); return nil }

// TestFaultUeventClassification drives the watcher with kernel-style
// events (PCI_ID, bind/unbind) the simulator does not emit, and with lost
// events, and checks what each batch asks for.
func TestFaultUeventClassification(t *testing.T) {
	cfg := testConfig(t, t.TempDir(), "")
	td := launch(t, cfg, nil, false)
	td.waitStarted()
	m := td.d.mgr
	vf := gpuState(t, m, simH100TS).VGPU.VFs[0].PCI
	pf := "/devices/pci0000:60/0000:60:01.1/" + simH100TS
	tests := []struct {
		name  string
		feed  []any
		want  resync
		fails int64
	}{
		{name: "other-vendor", feed: []any{uevent.Event{Action: uevent.Add, DevPath: "/devices/pci0000:00/0000:00:1f.3", Subsystem: "pci", Env: map[string]string{"PCI_ID": "8086:A0A3"}}}, want: noResync},
		{name: "other-subsystem", feed: []any{uevent.Event{Action: uevent.Remove, DevPath: "/devices/virtual/net/veth0", Subsystem: "net"}}, want: noResync},
		{name: "vf-type-set", feed: []any{uevent.Event{Action: uevent.Change, DevPath: "/x/" + vf, Subsystem: "pci", Env: map[string]string{"NVIDIA_VGPU_TYPE": "893"}}}, want: refresh},
		{name: "vf-unbound", feed: []any{uevent.Event{Action: uevent.Unbind, DevPath: "/x/" + vf, Subsystem: "pci"}}, want: reconcile},
		{name: "new-nvidia-function", feed: []any{uevent.Event{Action: uevent.Add, DevPath: "/x/0000:c1:00.0", Subsystem: "pci", Env: map[string]string{"PCI_ID": "10de:2330"}}}, want: reconcile},
		{name: "mdev-added", feed: []any{uevent.Event{Action: uevent.Add, DevPath: "/x/" + simA10 + "/u", Subsystem: "mdev"}}, want: refresh},
		{name: "events-lost", feed: []any{uevent.ErrOverflow}, want: reconcile},
		{name: "gpu-removed", feed: []any{uevent.Event{Action: uevent.Remove, DevPath: pf, Subsystem: "pci", Env: map[string]string{"PCI_ID": "10DE:2330"}}}, want: reconcile, fails: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := &fakeSource{ch: make(chan any), closed: make(chan struct{})}
			w := newFaultWatch(td.d)
			w.xids = nil
			// A settle time that never fires in the test: the batch is
			// inspected, not run. The worker is not started; the test
			// plays it.
			w.uev = make(chan uevent.Event, 16)
			w.overflow = make(chan struct{}, 1)
			w.failed, w.index, w.reasons = map[string]*failure{}, map[string]devRef{}, map[string]int{}
			w.reindex()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); w.readUevents(ctx, src) }()
			for _, x := range tt.feed {
				src.ch <- x
			}
			waitFor(t, "the reader to hand every event on", 5*time.Second, func() bool {
				return w.stats.Uevents.Load()+w.stats.Overflows.Load() == int64(len(tt.feed))
			})
			// Hand the reader's output to the worker's handlers.
			cancel()
			<-done
			for len(w.uev) > 0 {
				w.onUevent(<-w.uev)
			}
			if len(w.overflow) > 0 {
				<-w.overflow
				w.ask(reconcile, "uevents lost")
			}
			if w.want != tt.want || w.stats.Failures.Load() != tt.fails {
				t.Fatalf("batch wants %v (%v), failures %d; want %v, %d", w.want, w.reasons, w.stats.Failures.Load(), tt.want, tt.fails)
			}
		})
	}
}
