package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/dbusapi"
)

// driftH100 is the built-in simulated host's MIG-mode H100.
const driftH100 = "0000:41:00.0"

// driftInterval is the discovery interval the drift test runs vgpud with.
const driftInterval = 3 * time.Second

// TestDriftFoundWithoutRestart: with the daemon running, a simulated host
// reboot, a GPU instance destroyed by hand and one made by hand, none of
// which any uevent reports, are found by the periodic discovery within one
// interval (plus the pass itself): the vanished instances are re-created at
// their placements, the foreign one is reported, each with a HostDrift
// signal and a count in vgpud_drift_events_total; the daemon is never
// restarted.
func TestDriftFoundWithoutRestart(t *testing.T) {
	bus := testbus.Start(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	port := metricsFreePort(t)
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	watch := busNameWatcher(t, bus)
	vgpud := startMetricsProc(t, "vgpud", filepath.Join(dir, "vgpud.log"), bus.Env(), vgpudBin,
		"--sim", "--state-dir", state, "--metrics-listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--discovery-interval", driftInterval.String(), "--bus-address", bus.Address(), "--libvirt-socket", "", "--log-level", "info")
	metricsWaitHTTP(t, vgpud, metricsURL, 60*time.Second)
	metricsWaitBusName(t, vgpud, watch)
	pid := vgpud.cmd.Process.Pid

	ctl := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(vgpuctlBin, append([]string{"--connect", bus.Address()}, args...)...)
		cmd.Env = bus.Env()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("vgpuctl %v: %v\n%s", args, err, out)
		}
		return out
	}
	sim := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(vgpudBin, append([]string{"sim", "--sim", "--state-dir", state}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("vgpud sim %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, err := dbusapi.Dial(ctx, bus.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	events, err := client.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}

	ctl("tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited")
	ctl("create", "3g.40gb", "--tenant", "acme", "--gpu", driftH100)
	ctl("create", "L4-4Q", "--tenant", "acme")
	before := sim("summary")
	if n := driftMetric(t, metricsURL, "missing"); n != 0 {
		t.Fatalf("vgpud_drift_events_total{kind=missing} = %v before any drift", n)
	}

	// Each case changes the host behind vgpud's back and waits for the
	// repair, the signals and the counter.
	waitRepaired := func(what string, wantMissing float64, wantSignals int) {
		t.Helper()
		start := time.Now()
		// One interval for the pass to come, then the pass itself (a
		// discovery and the re-creation) on a machine others share.
		deadline := start.Add(driftInterval + 20*time.Second)
		got := 0
		for {
			drain := true
			for drain {
				select {
				case e := <-events:
					if e.Signal == "HostDrift" && e.Operation == "missing" && e.Kind == "instance" {
						got++
					}
				default:
					drain = false
				}
			}
			if got >= wantSignals && driftMetric(t, metricsURL, "missing") == wantMissing && sim("summary") == before {
				t.Logf("%s: repaired %v after the change (discovery interval %v)", what, time.Since(start).Round(100*time.Millisecond), driftInterval)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not repaired within %v: %d HostDrift signals (want %d), counter %v (want %v), host:\n%s\nwant:\n%s\nvgpud log:\n%s",
					what, time.Since(start).Round(time.Second), got, wantSignals, driftMetric(t, metricsURL, "missing"), wantMissing,
					sim("summary"), before, metricsTail(readFile(vgpud.log), 3000))
			}
			time.Sleep(200 * time.Millisecond)
		}
		var list struct {
			Items []dbusapi.Instance `json:"items"`
		}
		if err := json.Unmarshal(ctl("list", "-o", "json"), &list); err != nil {
			t.Fatal(err)
		}
		for _, in := range list.Items {
			if in.State != "ready" {
				t.Fatalf("%s: instance %s is %s", what, in.UUID, in.State)
			}
		}
	}

	sim("reboot")
	if sim("summary") == before {
		t.Fatal("the simulated reboot changed nothing")
	}
	waitRepaired("reboot", 2, 2)

	var list struct {
		Items []dbusapi.Instance `json:"items"`
	}
	if err := json.Unmarshal(ctl("list", "-o", "json"), &list); err != nil {
		t.Fatal(err)
	}
	gi := -1
	for _, in := range list.Items {
		if in.MIG != nil {
			gi = in.MIG.GPUInstanceID
		}
	}
	sim("destroy-gi", driftH100, strconv.Itoa(gi))
	waitRepaired("DestroyGpuInstance by hand", 3, 1)

	// A GPU instance nobody recorded: reported, counted, left alone.
	made := strings.TrimSpace(sim("create-gi", driftH100, "0"))
	deadline := time.Now().Add(driftInterval + 20*time.Second)
	for driftMetric(t, metricsURL, "foreign") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("foreign %s not counted within %v", made, driftInterval+20*time.Second)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out := string(ctl("reconcile")); !strings.Contains(out, "foreign gpu-instance") {
		t.Fatalf("vgpuctl reconcile does not list the foreign GPU instance:\n%s", out)
	}
	select {
	case <-vgpud.done:
		t.Fatal("vgpud exited during the test")
	default:
	}
	if vgpud.cmd.Process.Pid != pid {
		t.Fatal("vgpud was restarted")
	}
}

// driftMetric reads vgpud_drift_events_total{kind=KIND} from /metrics.
func driftMetric(t *testing.T, url, kind string) float64 {
	t.Helper()
	return scrapeSample(t, url, fmt.Sprintf("vgpud_drift_events_total{kind=%q}", kind))
}

// scrapeSample reads one sample (name and labels as the text format
// writes them) from the /metrics at url.
func scrapeSample(t *testing.T, url, sample string) float64 {
	t.Helper()
	r, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer r.Body.Close()
	prefix := sample + " "
	sc := bufio.NewScanner(r.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s%s: %v", prefix, v, err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics", sample)
	return 0
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}
