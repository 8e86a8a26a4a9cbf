package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// TestSettingsBackAfterEvents: heterogeneous vGPU mode and a pinned
// scheduler set through vgpuctl come back by themselves, with the daemon
// running, after each event that makes the driver forget them (`vgpud sim
// reset-gpu`, `driver unload`/`load`, `vf-rebind`), each announced with a
// HostDrift signal and counted in vgpud_settings_restored_total; after the
// VF rebind the mixed-size vGPUs it took are re-created, which needs the
// mode set first.
func TestSettingsBackAfterEvents(t *testing.T) {
	bus := testbus.Start(t)
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsFreePort(t))
	d := startBusDaemon(t, bus, busDaemonOpts{
		metricsListen: strings.TrimSuffix(strings.TrimPrefix(metricsURL, "http://"), "/metrics"),
		args:          []string{"--discovery-interval", "1s"},
	})
	h := openSim(t, d.stateDir)
	const l4 = sim.DefaultL4
	d.ctl(t, "gpu", "heterogeneous", l4, "on").must(t, "gpu heterogeneous on")
	d.ctl(t, "gpu", "scheduler", l4, "--policy", "fixed_share", "--timeslice", "2ms").must(t, "gpu scheduler")
	heterogeneous := func() bool {
		for _, g := range decodeSchema[docList[schemaGPU]](t, d.ctl(t, "gpus", "-o", "json").must(t, "gpus")).Items {
			if g.PCI == l4 {
				return g.VGPU.Heterogeneous
			}
		}
		t.Fatalf("gpus lacks %s", l4)
		return false
	}
	back := func(what string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			p, ts := driverSched(t, h, l4)
			if heterogeneous() && p == nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE && ts == 2_000_000 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: heterogeneous=%v, driver scheduler policy %d time slice %d ns\n%s", what, heterogeneous(), p, ts, tailText(d.log(), 4000))
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	back("set")

	// Each event, with no vGPU on the GPU (a reset is refused while there
	// are some, and while the VFs are enabled: an operator disables them
	// around it): the settings are lost, then set again.
	for _, ev := range [][][]string{
		{{"reset-gpu", l4, "--vfs-off"}},
		{{"driver", "unload"}, {"driver", "load"}},
	} {
		followEvents(t, d, func() {
			for _, args := range ev {
				d.sim(t, args...)
			}
		}, "HostDrift")
		back(ev[0][0])
	}

	// With mixed-size vGPUs: the rebind takes them with the settings; the
	// mode comes back before they are re-created.
	d.ctl(t, "tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited").must(t, "tenant define")
	var ids []string
	for _, p := range []string{"L4-4Q", "L4-8Q"} {
		ids = append(ids, decodeSchema[docInstance](t, d.ctl(t, "create", p, "--tenant", "acme", "--gpu", l4, "-o", "json").must(t, "create "+p)).Instance.UUID)
	}
	followEvents(t, d, func() { d.sim(t, "vf-rebind", l4) }, "HostDrift")
	back("vf-rebind")
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready := 0
		for _, in := range decodeSchema[docList[schemaInstance]](t, d.ctl(t, "list", "--tenant", "acme", "-o", "json").must(t, "list")).Items {
			if in.State == "ready" {
				ready++
			}
		}
		if ready == len(ids) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the VF rebind %d of %d instances are ready\n%s", ready, len(ids), tailText(d.log(), 4000))
		}
		time.Sleep(250 * time.Millisecond)
	}
	if !strings.Contains(d.log(), "GPU setting lost by the driver set again") {
		t.Fatalf("no log line for the restore\n%s", tailText(d.log(), 4000))
	}
	for _, s := range []string{"heterogeneous", "scheduler"} {
		if n := settingsRestored(t, metricsURL, s, "drift"); n < 3 {
			t.Errorf("vgpud_settings_restored_total{setting=%q,event=\"drift\"} = %v, want at least 3", s, n)
		}
	}
}

// settingsRestored reads vgpud_settings_restored_total{event,setting}.
func settingsRestored(t *testing.T, url, setting, event string) float64 {
	t.Helper()
	return scrapeSample(t, url, fmt.Sprintf("vgpud_settings_restored_total{event=%q,setting=%q}", event, setting))
}
