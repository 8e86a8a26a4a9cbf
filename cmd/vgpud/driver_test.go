package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
)

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
			notify.Await("waiting for the driver", 0, 10*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("STATUS=waiting for the NVIDIA driver") })
			notify.Await("EXTEND_TIMEOUT_USEC", 0, 10*time.Second, func(m testenv.NotifyMsg) bool { return m.Fields["EXTEND_TIMEOUT_USEC"] != "" })
			if tt.loadWhen == "waiting" {
				if err := h.SetDriverLoaded(true); err != nil {
					t.Fatal(err)
				}
			}
			ready, _ := notify.Await("READY=1", 0, 20*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
			td.waitStarted()
			m := td.d.mgr
			degraded := strings.Contains(ready.Fields["STATUS"], "degraded")
			if degraded != (tt.loadWhen == "degraded") {
				t.Fatalf("READY status %q, degraded %v", ready.Fields["STATUS"], degraded)
			}
			if tt.loadWhen == "degraded" {
				if _, err := m.GPUs(); err != nil {
					t.Fatalf("reads while degraded: %v", err)
				}
				simhost.DefineTenant(t, m, "acme")
				_, err := m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "L4-4Q"})
				if !errors.Is(err, manager.ErrBusy) || !strings.Contains(err.Error(), "carving is disabled") {
					t.Fatalf("create while degraded: %v, want ErrBusy (carving is disabled)", err)
				}
				// After the start, through the daemon's own handle (see
				// TestFaultWatchWiring).
				if err := td.d.host.sim.SetDriverLoaded(true); err != nil {
					t.Fatal(err)
				}
				notify.Await("a status without degraded", 0, 20*time.Second, func(m testenv.NotifyMsg) bool {
					s, ok := m.Fields["STATUS"]
					return ok && strings.Contains(s, "GPUs") && !strings.Contains(s, "degraded")
				})
				if m.Degraded() != "" {
					t.Fatalf("still degraded: %s", m.Degraded())
				}
			} else {
				simhost.DefineTenant(t, m, "acme")
			}
			simhost.MustCreate(t, m, "acme", "L4-4Q", sim.DefaultL4)
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
			if err := h.SetVFs(sim.DefaultH100TS, false); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			td := launch(t, cfg, nil, true)
			notify.Await("waiting for VFs", 0, 10*time.Second, func(m testenv.NotifyMsg) bool {
				return m.Has("STATUS=waiting for SR-IOV virtual functions on " + sim.DefaultH100TS)
			})
			if tt.enable {
				if err := h.SetVFs(sim.DefaultH100TS, true); err != nil {
					t.Fatal(err)
				}
			}
			notify.Await("READY=1", 0, 20*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
			td.waitStarted()
			t.Logf("start took %v", time.Since(start).Round(time.Millisecond))
			m := td.d.mgr
			if m.Degraded() != "" {
				t.Fatalf("degraded: %s", m.Degraded())
			}
			g := simhost.GPU(t, m, sim.DefaultH100TS)
			if got := len(g.VGPU.VFs) > 0; got != tt.enable {
				t.Fatalf("VFs at the first reconcile: %d", len(g.VGPU.VFs))
			}
			if !tt.enable && !strings.Contains(td.logs.String(), "SR-IOV virtual functions did not appear") {
				t.Fatal("no log line naming the missing VFs")
			}
		})
	}
}
