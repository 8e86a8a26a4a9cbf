package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/vgpud/vgpud/internal/testenv"
	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/config"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// ---- test harness: a daemon in this process, wired as serve() wires it ----

// testConfig builds a configuration the way main does: flags over a file.
// yaml is the file's content; "" means short fault timings, set in the
// file (not as flags) so that a reload can change them.
func testConfig(t *testing.T, stateDir, yaml string, args ...string) *config.Config {
	t.Helper()
	if yaml == "" {
		yaml = "ueventSettle: 50ms\nrecoverProbe: 100ms\n"
	}
	file := filepath.Join(t.TempDir(), "vgpud.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	fs := pflag.NewFlagSet("vgpud", pflag.ContinueOnError)
	cfg.BindFlags(fs)
	base := []string{"--config", file, "--state-dir", stateDir, "--sim", "--metrics-listen", "", "--libvirt-socket", "",
		"--profiles-dir", "", "--driver-wait", "2s", "--log-level", "debug"}
	if err := fs.Parse(append(base, args...)); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Load(fs); err != nil {
		t.Fatalf("load configuration: %v", err)
	}
	return cfg
}

// testDaemon is a daemon started in-process.
type testDaemon struct {
	t    *testing.T
	d    *daemon
	logs *testenv.Buffer
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
func openSimHost(t *testing.T, cfg *config.Config) *sim.Host {
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
func launch(t *testing.T, cfg *config.Config, ctx context.Context, run bool) *testDaemon {
	t.Helper()
	logs := &testenv.Buffer{}
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

// listenNotify opens the service manager's end of $NOTIFY_SOCKET and
// points $NOTIFY_SOCKET at it.
func listenNotify(t *testing.T) *testenv.NotifySocket {
	t.Helper()
	n := testenv.ListenNotify(t)
	t.Setenv("NOTIFY_SOCKET", n.Path())
	return n
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
	notify.Await("READY=1", 0, 30*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
	td.waitStarted()
	// The NVML event loop says when its GPUs are registered; before, an
	// XID would be missed.
	testenv.WaitFor(t, "the NVML event loop", 10*time.Second, func() bool {
		return strings.Contains(td.logs.String(), "watching NVML events")
	})
	// Change the host through the daemon's own handle: a change through a
	// second handle makes the daemon's handle reload state.json, which
	// races with its concurrent NVML calls inside the simulator.
	h := td.d.host.sim
	m := td.d.mgr

	if err := os.WriteFile(cfg.File(), []byte("ueventSettle: 50ms\nrecoverProbe: 100ms\ncriticalXIDs: [13, 79]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mark := notify.Count()
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	_, rl := notify.Await("RELOADING=1", mark, 10*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("RELOADING=1") })
	_, rd := notify.Await("READY=1 after the reload", rl, 10*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })

	if err := h.InjectXID(sim.DefaultH100TS, 13, -1); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the GPU to read failed", 10*time.Second, func() bool { return simhost.GPU(t, m, sim.DefaultH100TS).State == "failed" })
	if v := simhost.GPU(t, m, sim.DefaultH100TS); !strings.Contains(v.Reason, "XID 13") {
		t.Fatalf("reason %q, want XID 13", v.Reason)
	}
	notify.Await("a status naming the failed GPU", rd, 10*time.Second, func(m testenv.NotifyMsg) bool {
		return strings.Contains(m.Fields["STATUS"], "1 GPUs lost or failed")
	})

	if err := h.EmitUevent("bind", simhost.DevPath(sim.DefaultH100TS), "pci", map[string]string{"DRIVER": "nvidia", "PCI_ID": "10DE:2330"}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the GPU back in service", 10*time.Second, func() bool { return simhost.GPU(t, m, sim.DefaultH100TS).State == "ok" })
}
