package main

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/config"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/store"
)

// TestReload sends SIGHUP to a running daemon: each reload is announced
// with RELOADING=1 and ended with READY=1, the fault settings apply at
// once, other changes are named as needing a restart, an invalid file is
// refused with the running configuration kept, and no state is dropped.
func TestReload(t *testing.T) {
	notify := listenNotify(t)
	dir := t.TempDir()
	cfg := testConfig(t, dir, "")
	file := cfg.File()
	td := launch(t, cfg, nil, true)
	notify.Await("READY=1", 0, 30*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
	td.waitStarted()
	m := td.d.mgr
	simhost.DefineTenant(t, m, "acme")
	inst := simhost.MustCreate(t, m, "acme", "L4-4Q", sim.DefaultL4)

	tests := []struct {
		name       string
		yaml       string
		reloadable func(l *config.Reloadable) bool
		wantLog    string
	}{
		{name: "fault-settings-apply", yaml: "ueventSettle: 80ms\nrecoverProbe: 300ms\ncriticalXIDs: [79, 48]\ndiscoveryInterval: 7s\n",
			reloadable: func(l *config.Reloadable) bool {
				return l.UeventSettle == 80*time.Millisecond && l.RecoverProbe == 300*time.Millisecond && !l.CriticalXIDs[94] &&
					l.DiscoveryInterval == 7*time.Second
			},
			wantLog: "applied=\"[criticalXIDs discoveryInterval recoverProbe ueventSettle]\""},
		{name: "restart-settings-named", yaml: "ueventSettle: 80ms\nrecoverProbe: 300ms\ncriticalXIDs: [79, 48]\nundefinePolicy: keep\ncollectInterval: 2s\n",
			reloadable: func(l *config.Reloadable) bool { return l.UeventSettle == 80*time.Millisecond },
			wantLog:    "settings=\"[collectInterval undefinePolicy]\""},
		{name: "invalid-refused", yaml: "ueventSettle: 1ms\n",
			reloadable: func(l *config.Reloadable) bool { return l.UeventSettle == 80*time.Millisecond },
			wantLog:    "reload refused: configuration invalid"},
		{name: "unknown-key-refused", yaml: "ueventSetle: 90ms\n",
			reloadable: func(l *config.Reloadable) bool { return l.UeventSettle == 80*time.Millisecond },
			wantLog:    `unknown field \"ueventSetle\"`},
		{name: "fleet-offer-refused", yaml: "ueventSettle: 80ms\nfleet:\n  endpoint: http://127.0.0.1:1\n  offer:\n    L4-24GB: [3g.40gb]\n",
			reloadable: func(l *config.Reloadable) bool { return l.UeventSettle == 80*time.Millisecond },
			wantLog:    `reload: fleet settings refused; the running fleet settings are kept" err="fleet.offer.L4-24GB: model L4-24GB has no profile \"3g.40gb\"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := os.WriteFile(file, []byte(tt.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			mark := notify.Count()
			if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			_, rl := notify.Await("RELOADING=1", mark, 10*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("RELOADING=1") })
			notify.Await("READY=1 after the reload", rl, 10*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
			if l := td.d.cfg.Reloadable(); !tt.reloadable(l) {
				t.Fatalf("reloadable settings after reload: %+v", l)
			}
			if logs := td.logs.String(); !strings.Contains(logs, tt.wantLog) {
				t.Fatalf("log lacks %s", tt.wantLog)
			}
			if st := simhost.InstanceStates(t, m)[inst.UUID]; st != store.StateReady {
				t.Fatalf("instance after reload: %q", st)
			}
		})
	}
}

// TestReloadKeepsWatchdog: a reload whose host re-read is slow runs beside
// the main loop, which keeps pinging the watchdog until READY=1.
func TestReloadKeepsWatchdog(t *testing.T) {
	notify := listenNotify(t)
	t.Setenv("WATCHDOG_USEC", "400000")
	cfg := testConfig(t, t.TempDir(), "")
	h := openSimHost(t, cfg)
	launch(t, cfg, nil, true)
	notify.Await("READY=1", 0, 30*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
	// The reload's re-read of the host reads every GPU's MIG mode, which
	// nothing else running here does (the event loop also counts GPUs).
	if err := h.AddFault(sim.Fault{Op: "GetMigMode", Delay: "2s", Count: 1}); err != nil {
		t.Fatal(err)
	}
	mark := notify.Count()
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	_, rl := notify.Await("RELOADING=1", mark, 10*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("RELOADING=1") })
	_, rd := notify.Await("READY=1 after the reload", rl, 20*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
	pings := 0
	for _, m := range notify.Between(rl, rd) {
		if m.Has("WATCHDOG=1") {
			pings++
		}
	}
	// A 2 s re-read spans about ten pings at 200 ms; the loop blocked by
	// the reload would send none.
	if pings < 3 {
		t.Fatalf("%d watchdog pings during a 2 s reload, want the loop to keep pinging", pings)
	}
}

// TestReloadKeepsFlags: flags given at start win over the file at every
// reload, as they did at start, and a reload names only the settings whose
// value in force would change. The configuration is loaded by the daemon's
// own command line, which binds the flags to the root command's persistent
// set and parses them in the command's merged one.
func TestReloadKeepsFlags(t *testing.T) {
	// The bus first: a dbus-daemon started with $NOTIFY_SOCKET set sends
	// its own READY=1 there.
	bus := testbus.Start(t)
	notify := listenNotify(t)
	file := filepath.Join(t.TempDir(), "vgpud.yaml")
	// Every flag below disagrees with the file.
	fileYAML := "logLevel: warn\ncriticalXIDs: [48]\nstateDir: /var/lib/elsewhere\nmetricsListen: 127.0.0.1:9835\n" +
		"busAddress: unix:path=/run/elsewhere\nueventSettle: 50ms\nrecoverProbe: 100ms\n"
	if err := os.WriteFile(file, []byte(fileYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	root := rootCmd(cfg, func(context.Context, *config.Config) error { return nil })
	root.SetArgs([]string{"--config", file, "--state-dir", t.TempDir(), "--sim", "--bus-address", bus.Address(),
		"--metrics-listen", "", "--libvirt-socket", "", "--profiles-dir", "", "--driver-wait", "2s",
		"--log-level", "debug", "--critical-xids", "79,94"})
	if err := root.Execute(); err != nil {
		t.Fatalf("command line: %v", err)
	}
	td := launch(t, cfg, nil, true)
	notify.Await("READY=1", 0, 30*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
	td.waitStarted()
	flagsWin := func(t *testing.T) {
		t.Helper()
		l := td.d.cfg.Reloadable()
		if l.LogLevel != "debug" || !reflect.DeepEqual(l.CriticalXIDs, map[uint64]bool{79: true, 94: true}) {
			t.Fatalf("after the reload: log level %q, critical XIDs %v; want the flags' debug and [79 94]", l.LogLevel, l.CriticalXIDs)
		}
	}
	flagsWin(t)

	tests := []struct {
		name, yaml string
		// want is in the reload's log, and never is not.
		want, never string
	}{
		{name: "file-unchanged", yaml: fileYAML, want: `configuration reloaded`, never: "take effect at the next start"},
		{name: "only-the-real-change-named", yaml: fileYAML + "undefinePolicy: keep\n", want: `settings=[undefinePolicy]`},
		{name: "file-changes-what-a-flag-sets", yaml: strings.Replace(fileYAML, "logLevel: warn", "logLevel: error", 1) + "undefinePolicy: keep\n",
			want: `settings=[undefinePolicy]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := os.WriteFile(file, []byte(tt.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			logMark, mark := len(td.logs.String()), notify.Count()
			if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			_, rl := notify.Await("RELOADING=1", mark, 10*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("RELOADING=1") })
			notify.Await("READY=1 after the reload", rl, 10*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
			logs := td.logs.String()[logMark:]
			if !strings.Contains(logs, tt.want) || tt.never != "" && strings.Contains(logs, tt.never) {
				t.Fatalf("reload log, want %q and not %q:\n%s", tt.want, tt.never, logs)
			}
			if strings.Contains(logs, "applied=[logLevel") || strings.Contains(logs, "criticalXIDs") {
				t.Fatalf("a setting the flags hold was reported as changed:\n%s", logs)
			}
			flagsWin(t)
		})
	}
}

// TestStartRefusesFleetOffer: a fleet.offer the catalog refuses stops the
// daemon at start, before the start-up reconcile (which, without the
// fleet, would undo the cut-off fleet creates it should confirm).
func TestStartRefusesFleetOffer(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir, "fleet:\n  endpoint: http://127.0.0.1:1\n  offer:\n    L4-24GB: [3g.40gb]\n")
	td := launch(t, cfg, nil, false)
	select {
	case <-td.started:
	case <-time.After(30 * time.Second):
		t.Fatal("daemon start did not return")
	}
	const want = `fleet: fleet.offer.L4-24GB: model L4-24GB has no profile "3g.40gb"`
	if td.startErr == nil || !strings.Contains(td.startErr.Error(), want) {
		t.Fatalf("start = %v; want %s", td.startErr, want)
	}
	if logs := td.logs.String(); strings.Contains(logs, "start-up reconcile done") {
		t.Fatalf("the start-up reconcile ran before the fleet settings were refused:\n%s", logs)
	}
}
