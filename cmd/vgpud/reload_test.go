package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

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
	file := cfg.file
	td := launch(t, cfg, nil, true)
	notify.await("READY=1", 30*time.Second, func(m notifyMsg) bool { return m.has("READY=1") })
	td.waitStarted()
	m := td.d.mgr
	defineTenant(t, m, "acme")
	inst := mustCreate(t, m, "L4-4Q", simL4)

	tests := []struct {
		name    string
		yaml    string
		live    func(l *Live) bool
		wantLog string
	}{
		{name: "fault-settings-apply", yaml: "ueventSettle: 80ms\nrecoverProbe: 300ms\ncriticalXIDs: [79, 48]\n",
			live: func(l *Live) bool {
				return l.UeventSettle == 80*time.Millisecond && l.RecoverProbe == 300*time.Millisecond && !l.CriticalXIDs[94]
			},
			wantLog: "applied=\"[criticalXIDs recoverProbe ueventSettle]\""},
		{name: "restart-settings-named", yaml: "ueventSettle: 80ms\nrecoverProbe: 300ms\ncriticalXIDs: [79, 48]\nundefinePolicy: keep\ncollectInterval: 2s\n",
			live:    func(l *Live) bool { return l.UeventSettle == 80*time.Millisecond },
			wantLog: "settings=\"[collectInterval undefinePolicy]\""},
		{name: "invalid-refused", yaml: "ueventSettle: 1ms\n",
			live:    func(l *Live) bool { return l.UeventSettle == 80*time.Millisecond },
			wantLog: "reload refused: configuration invalid"},
		{name: "unknown-key-refused", yaml: "ueventSetle: 90ms\n",
			live:    func(l *Live) bool { return l.UeventSettle == 80*time.Millisecond },
			wantLog: `unknown field \"ueventSetle\"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := os.WriteFile(file, []byte(tt.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			mark := len(notify.all())
			if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			_, rl := notify.awaitFrom(mark, "RELOADING=1", 10*time.Second, func(m notifyMsg) bool { return m.has("RELOADING=1") })
			notify.awaitFrom(rl, "READY=1 after the reload", 10*time.Second, func(m notifyMsg) bool { return m.has("READY=1") })
			if l := td.d.cfg.Live(); !tt.live(l) {
				t.Fatalf("live settings after reload: %+v", l)
			}
			if logs := td.logs.String(); !strings.Contains(logs, tt.wantLog) {
				t.Fatalf("log lacks %s", tt.wantLog)
			}
			if st := instanceStates(t, m)[inst.UUID]; st != store.StateReady {
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
	notify.await("READY=1", 30*time.Second, func(m notifyMsg) bool { return m.has("READY=1") })
	// The reload's re-read of the host reads every GPU's MIG mode, which
	// nothing else running here does (the event loop also counts GPUs).
	if err := h.AddFault(sim.Fault{Op: "GetMigMode", Delay: "2s", Count: 1}); err != nil {
		t.Fatal(err)
	}
	mark := len(notify.all())
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	_, rl := notify.awaitFrom(mark, "RELOADING=1", 10*time.Second, func(m notifyMsg) bool { return m.has("RELOADING=1") })
	_, rd := notify.awaitFrom(rl, "READY=1 after the reload", 20*time.Second, func(m notifyMsg) bool { return m.has("READY=1") })
	pings := 0
	for _, m := range notify.since(rl)[:rd-rl] {
		if m.has("WATCHDOG=1") {
			pings++
		}
	}
	// A 2 s re-read spans about ten pings at 200 ms; the loop blocked by
	// the reload would send none.
	if pings < 3 {
		t.Fatalf("%d watchdog pings during a 2 s reload, want the loop to keep pinging", pings)
	}
}

func TestChangedSettings(t *testing.T) {
	base := defaultConfig()
	tests := []struct {
		name             string
		change           func(c *Config)
		applied, restart string
	}{
		{name: "nothing", change: func(*Config) {}, applied: "[]", restart: "[]"},
		{name: "xids-reordered-is-no-change", change: func(c *Config) {
			c.CriticalXIDs = []uint{120, 119, 95, 94, 79, 64, 62, 48}
		}, applied: "[]", restart: "[]"},
		{name: "live", change: func(c *Config) { c.UeventSettle = Duration{time.Second} }, applied: "[ueventSettle]", restart: "[]"},
		{name: "restart", change: func(c *Config) { c.StateDir = "/srv"; c.LogLevel = "debug" }, applied: "[logLevel]", restart: "[stateDir]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := defaultConfig()
			tt.change(next)
			a, r := changedSettings(base, next)
			if fmt.Sprint(a) != tt.applied || fmt.Sprint(r) != tt.restart {
				t.Fatalf("applied %v restart %v, want %s %s", a, r, tt.applied, tt.restart)
			}
		})
	}
}
