package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
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

func simDevPath(pci string) string { return "devices/pci0000:00/" + pci }

func firstLine(summary, pci string) string {
	for _, l := range strings.Split(summary, "\n") {
		if strings.HasPrefix(l, pci) {
			return l
		}
	}
	return ""
}

// ---- fault watcher wiring ----

// TestFaultWatchWiring: the running daemon's fault watcher (pkg/health) is
// wired to the host and to the daemon. A reload makes an application XID
// critical; that XID, from the driver's event source, fails the GPU in the
// manager, and systemd's status says so; its reset, a bind seen on the
// simulated kernel's uevent source, brings it back.
func TestFaultWatchWiring(t *testing.T) {
	notify := listenNotify(t)
	cfg := testConfig(t, t.TempDir(), "")
	td := launch(t, cfg, nil, true)
	notify.await("READY=1", 30*time.Second, func(m notifyMsg) bool { return m.has("READY=1") })
	td.waitStarted()
	// The NVML event loop says when its GPUs are registered; before, an
	// XID would be missed.
	waitFor(t, "the NVML event loop", 10*time.Second, func() bool {
		return strings.Contains(td.logs.String(), "watching NVML events")
	})
	// Change the host through the daemon's own handle: a change through a
	// second handle makes the daemon's handle reload state.json, which
	// races with its concurrent NVML calls inside the simulator.
	h := td.d.host.sim
	m := td.d.mgr

	if err := os.WriteFile(cfg.file, []byte("ueventSettle: 50ms\nrecoverProbe: 100ms\ncriticalXIDs: [13, 79]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mark := len(notify.all())
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	_, rl := notify.awaitFrom(mark, "RELOADING=1", 10*time.Second, func(m notifyMsg) bool { return m.has("RELOADING=1") })
	_, rd := notify.awaitFrom(rl, "READY=1 after the reload", 10*time.Second, func(m notifyMsg) bool { return m.has("READY=1") })

	if err := h.InjectXID(simH100TS, 13, -1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the GPU to read failed", 10*time.Second, func() bool { return gpuState(t, m, simH100TS).State == "failed" })
	if v := gpuState(t, m, simH100TS); !strings.Contains(v.Reason, "XID 13") {
		t.Fatalf("reason %q, want XID 13", v.Reason)
	}
	notify.awaitFrom(rd, "a status naming the failed GPU", 10*time.Second, func(m notifyMsg) bool {
		return strings.Contains(m.fields["STATUS"], "1 GPUs lost or failed")
	})

	if err := h.EmitUevent("bind", simDevPath(simH100TS), "pci", map[string]string{"DRIVER": "nvidia", "PCI_ID": "10DE:2330"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the GPU back in service", 10*time.Second, func() bool { return gpuState(t, m, simH100TS).State == "ok" })
}
