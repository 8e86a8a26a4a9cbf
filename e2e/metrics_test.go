package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"

	"sigs.k8s.io/yaml"

	"github.com/vgpud/vgpud/dashboards"
	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/dbusapi"
)

// The metrics e2e host: a MIG H100 (capped later), an L4 on the mdev
// flow (its vGPUs are matched to instances by mdev UUID, as no libvirt
// runs here), and an idle A10.
const metricsHostSpec = `version: v1
gpus:
  - {model: H100-SXM5-80GB, pci: "0000:41:00.0", flavour: vfio, mig: true}
  - {model: L4-24GB, pci: "0000:81:00.0", flavour: mdev, numaNode: 1}
  - {model: A10-24GB, pci: "0000:a1:00.0", flavour: mdev, numaNode: 1}
`

const (
	metricsH100 = "0000:41:00.0"
	metricsL4   = "0000:81:00.0"
)

func metricsTail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

func metricsFreePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// metricsProc is a child process the test owns, with its output in a file.
type metricsProc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startMetricsProc(t *testing.T, name, logPath string, env []string, bin string, args ...string) *metricsProc {
	t.Helper()
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr, cmd.Env = f, f, env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &metricsProc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s log:\n%s", name, metricsTail(string(b), 4000))
		}
	})
	return p
}

// metricsWaitBusName waits until p has taken dev.vgpud1 (watch is
// busNameWatcher's, set up before p started): the metrics endpoint
// answers before the D-Bus service is ready, so a test that goes on to
// call vgpuctl waits for both.
func metricsWaitBusName(t *testing.T, p *metricsProc, watch <-chan struct{}) {
	t.Helper()
	select {
	case <-watch:
	case <-p.done:
		b, _ := os.ReadFile(p.log)
		t.Fatalf("%s exited:\n%s", p.name, metricsTail(string(b), 4000))
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not take %s within 60s", p.name, dbusapi.BusName)
	}
}

// waitHTTP polls url until it answers 200.
func metricsWaitHTTP(t *testing.T, p *metricsProc, u string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			b, _ := os.ReadFile(p.log)
			t.Fatalf("%s exited:\n%s", p.name, metricsTail(string(b), 4000))
		default:
		}
		if r, err := http.Get(u); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s did not answer %s within %v", p.name, u, within)
}

type metricsPromResult struct {
	Status string `json:"status"`
	Error  string `json:"error"`
	Data   struct {
		ResultType string            `json:"resultType"`
		Result     []json.RawMessage `json:"result"`
	} `json:"data"`
}

func metricsPromQuery(t *testing.T, base, expr string) (metricsPromResult, error) {
	t.Helper()
	r, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return metricsPromResult{}, err
	}
	defer r.Body.Close()
	var out metricsPromResult
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &out); err != nil {
		return out, fmt.Errorf("decode %q: %w", body, err)
	}
	if out.Status != "success" {
		return out, fmt.Errorf("%s", out.Error)
	}
	return out, nil
}

// grafanaVars turns a panel query into PromQL Prometheus runs: the
// dashboard variables select everything, the range variables a window
// the test's scrapes fill.
func metricsGrafanaVars(expr string) string {
	r := strings.NewReplacer("$gpu", ".+", "$tenant", ".+", "$instance", ".+", "$__rate_interval", "30s", "$__interval", "5s", "$__range", "5m")
	return r.Replace(expr)
}

var metricsQueryResult = regexp.MustCompile(`^query_result\((.+)\)$`)

var metricsLabelValues = regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

type metricsDocInstance struct {
	Instance dbusapi.Instance `json:"instance"`
}

// TestMetricsPrometheus runs vgpud --sim with tenants, instances and
// workloads, a real Prometheus scraping it with the project's rules, and
// checks that every dashboard query and every recording rule returns
// data, and that promtool accepts the exposition and the rules.
func TestMetricsPrometheus(t *testing.T) {
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		skipMissing(t, "prometheus is not installed (Debian package prometheus)")
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		skipMissing(t, "promtool is not installed (Debian package prometheus)")
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bus := testbus.Start(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	spec := filepath.Join(dir, "host.yaml")
	if err := os.WriteFile(spec, []byte(metricsHostSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	port := metricsFreePort(t)
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	watch := busNameWatcher(t, bus)
	vgpud := startMetricsProc(t, "vgpud", filepath.Join(dir, "vgpud.log"), bus.Env(), vgpudBin,
		"--sim", "--sim-host", spec, "--state-dir", state, "--metrics-listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--collect-interval", "1s", "--bus-address", bus.Address(), "--libvirt-socket", "", "--log-level", "info")
	metricsWaitHTTP(t, vgpud, metricsURL, 60*time.Second)
	metricsWaitBusName(t, vgpud, watch)

	// Prometheus scrapes vgpud every second (in protobuf: native
	// histograms are on) and a dcgm-exporter sample beside it, and
	// evaluates the rules every second.
	dcgm := startDCGMTarget(t)
	pport := metricsFreePort(t)
	promURL := fmt.Sprintf("http://127.0.0.1:%d", pport)
	cfg := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
  - job_name: vgpud
    static_configs: [{targets: ["127.0.0.1:%d"]}]
  - job_name: dcgm
    static_configs: [{targets: [%q]}]
`, filepath.Join(root, "dashboards", "rules.yml"), port, dcgm.hostPort())
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	prom := startMetricsProc(t, "prometheus", filepath.Join(dir, "prometheus.log"), os.Environ(), promBin,
		"--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+fmt.Sprintf("127.0.0.1:%d", pport), "--log.level=warn", "--enable-feature=native-histograms")
	metricsWaitHTTP(t, prom, promURL+"/-/ready", 60*time.Second)

	ctl := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(vgpuctlBin, append([]string{"--connect", bus.Address()}, args...)...)
		cmd.Env = bus.Env()
		out, err := cmd.Output()
		if err != nil {
			stderr := ""
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("vgpuctl %v: %v\n%s%s", args, err, out, stderr)
		}
		return out
	}
	sim := func(args ...string) {
		t.Helper()
		out, err := exec.Command(vgpudBin, append([]string{"sim", "--sim", "--state-dir", state}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("vgpud sim %v: %v\n%s", args, err, out)
		}
	}
	// Let Prometheus see the counters at zero before anything happens.
	time.Sleep(3 * time.Second)
	ctl("tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited", "--class", "guaranteed")
	ctl("tenant", "define", "crunch", "--vram", "unlimited", "--compute", "unlimited", "--class", "best-effort")
	create := func(profile, tenant, gpu string) dbusapi.Instance {
		var d metricsDocInstance
		if err := json.Unmarshal(ctl("create", profile, "--tenant", tenant, "--gpu", gpu, "-o", "json"), &d); err != nil {
			t.Fatal(err)
		}
		return d.Instance
	}
	victim := create("L4-12C", "acme", metricsL4)
	noisy := create("L4-12C", "crunch", metricsL4)
	migA := create("1g.10gb", "acme", metricsH100)
	migB := create("3g.40gb", "crunch", metricsH100)
	if victim.VGPU == nil || victim.VGPU.MdevUUID == "" || migA.MIG == nil {
		t.Fatalf("created %+v, %+v: want an mdev vGPU and a MIG instance", victim, migA)
	}
	// dcgm-exporter's view of the same host: GPU indexes and UUIDs as
	// vgpuctl reports them, bus ids written from the host spec.
	gpus := hostGPUs(t, ctl)
	h100, l4 := gpus[metricsH100], gpus[metricsL4]
	dcgmGPUs := []dcgmGPU{
		{index: h100.Index, uuid: h100.UUID, busID: dcgmBusID(metricsH100), modelName: "NVIDIA H100 80GB HBM3", migs: []dcgmMIG{
			{gi: migA.MIG.GPUInstanceID, profile: "1g.10gb", fbUsedMiB: 3000, smActv: 0.14},
			{gi: migB.MIG.GPUInstanceID, profile: "3g.40gb", fbUsedMiB: 20000, smActv: 0.9}}},
		{index: l4.Index, uuid: l4.UUID, busID: dcgmBusID(metricsL4), modelName: "NVIDIA L4", fbUsedMiB: 12000},
	}
	dcgm.text.Store(dcgmExposition(dcgmGPUs))
	// A destroy, for its duration (attach and detach need libvirtd: their
	// durations are checked in cmd/vgpud's TestForwardEventsDurations).
	ctl("destroy", create("1g.10gb", "crunch", metricsH100).UUID)
	for i, x := range []dbusapi.Instance{victim, noisy} {
		sim("open-device", x.VGPU.MdevUUID, "--vm-uuid", fmt.Sprintf("6a1c2d3e-0000-4000-8000-00000000000%d", i), "--vm-name", "vm-"+x.Tenant)
	}
	sim("workload", victim.VGPU.MdevUUID, "steady", "--demand", "0.5")
	sim("workload", noisy.VGPU.MdevUUID, "noisy")
	sim("workload", fmt.Sprintf("%s/gi%d", metricsH100, migA.MIG.GPUInstanceID), "steady", "--demand", "0.14")
	sim("workload", fmt.Sprintf("%s/gi%d", metricsH100, migB.MIG.GPUInstanceID), "noisy")
	sim("power-cap", metricsH100, "350")
	sim("xid", metricsH100, "13")

	// The share loop finds the victim starved and wants FIXED_SHARE; the
	// driver refuses while the VMs run. A maintenance restart lets it land.
	time.Sleep(8 * time.Second)
	for _, x := range []dbusapi.Instance{victim, noisy} {
		sim("close-device", x.VGPU.MdevUUID)
	}
	time.Sleep(1500 * time.Millisecond)
	for i, x := range []dbusapi.Instance{victim, noisy} {
		sim("open-device", x.VGPU.MdevUUID, "--vm-uuid", fmt.Sprintf("6a1c2d3e-0000-4000-8000-00000000000%d", i), "--vm-name", "vm-"+x.Tenant)
	}
	time.Sleep(10 * time.Second)

	// promtool check metrics on what vgpud serves.
	r, err := http.Get(metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	exposition, _ := io.ReadAll(r.Body)
	r.Body.Close()
	check := exec.Command(promtool, "check", "metrics")
	check.Stdin = bytes.NewReader(exposition)
	if out, err := check.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
	checkNegotiated(t, metricsURL, exposition)
	checkProtobufScrape(t, promURL, exposition)
	checkDCGMJoins(t, promURL, dcgmGPUs,
		map[int]string{migA.MIG.GPUInstanceID: migA.Tenant, migB.MIG.GPUInstanceID: migB.Tenant},
		map[int]string{migA.MIG.GPUInstanceID: migA.UUID, migB.MIG.GPUInstanceID: migB.UUID})
	for _, args := range [][]string{{"check", "rules", "rules.yml"}, {"test", "rules", "rules_test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = filepath.Join(root, "dashboards")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}

	// Every panel query and every dashboard variable returns data.
	queries, empty := 0, 0
	for _, d := range dashboards.All() {
		for _, v := range d.Vars {
			if q := metricsQueryResult.FindStringSubmatch(v.Query); q != nil {
				// The GPU options: one series per GPU with the UUID (the
				// value) and a display label naming bus id and model.
				res := promSamples(t, promURL, q[1])
				if len(res) == 0 {
					t.Errorf("%s: variable %s (%s): no values", d.File, v.Name, v.Query)
				}
				for _, s := range res {
					if s.Metric["UUID"] == "" || !strings.Contains(s.Metric["gpu_display"], s.Metric["pci_bus_id"]) || !strings.Contains(s.Metric["gpu_display"], s.Metric["model"]) {
						t.Errorf("%s: variable %s: option %v lacks the UUID or a text with bus id and model", d.File, v.Name, s.Metric)
					}
				}
				continue
			}
			m := metricsLabelValues.FindStringSubmatch(v.Query)
			if m == nil {
				t.Errorf("%s: variable %s: %q is not label_values(metric, label)", d.File, v.Name, v.Query)
				continue
			}
			res, err := metricsPromQuery(t, promURL, fmt.Sprintf("count by (%s) (%s)", m[2], m[1]))
			if err != nil || len(res.Data.Result) == 0 {
				t.Errorf("%s: variable %s (%s): no values (%v)", d.File, v.Name, v.Query, err)
			}
		}
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				queries++
				expr := metricsGrafanaVars(tg.Expr)
				res, err := metricsPromQuery(t, promURL, expr)
				if err != nil {
					t.Errorf("%s: panel %q: %s: %v", d.File, p.Title, expr, err)
					continue
				}
				if len(res.Data.Result) == 0 {
					empty++
					t.Errorf("%s: panel %q: %s returned no data", d.File, p.Title, expr)
				}
			}
		}
	}
	// Every recording rule returns data.
	var rf struct {
		Groups []struct {
			Rules []struct {
				Record string `json:"record"`
			} `json:"rules"`
		} `json:"groups"`
	}
	b, err := os.ReadFile(filepath.Join(root, "dashboards", "rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rf); err != nil {
		t.Fatal(err)
	}
	records := 0
	for _, g := range rf.Groups {
		for _, rule := range g.Rules {
			if rule.Record == "" {
				continue
			}
			records++
			res, err := metricsPromQuery(t, promURL, rule.Record)
			if err != nil || len(res.Data.Result) == 0 {
				t.Errorf("recording rule %s: no data (%v)", rule.Record, err)
			}
		}
	}
	t.Logf("%d panel queries (%d empty), %d recording rules, exposition %d bytes", queries, empty, records, len(exposition))

	// What the scenario should show: the switch landed, the victim is no
	// longer starved, the power cap shows on the MIG instances.
	for _, want := range []struct{ expr, what string }{
		{`vgpud_gpu_scheduler_policy_switches_total{from="best_effort",to="fixed_share"} >= 1`, "a best-effort -> fixed-share switch"},
		{`vgpud_gpu_scheduler_policy_refusals_total{reason="not_supported"} >= 1`, "the driver's NOT_SUPPORTED refusals counted"},
		{fmt.Sprintf(`vgpud_instance_interference_index{instance_uuid=%q} <= 0.05`, victim.UUID), "the victim's interference down after the switch"},
		{fmt.Sprintf(`max_over_time(vgpud_instance_interference_index{instance_uuid=%q}[1m]) >= 0.3`, victim.UUID), "the victim starved before the switch"},
		{fmt.Sprintf(`vgpud_instance_clock_event_seconds_total{instance_uuid=%q,reason="sw_power_cap"} > 0`, migA.UUID), "power-cap time attributed to the MIG instance"},
		{`vgpud_operations_total{op="create",outcome="success"} == 5`, "five creates counted"},
		{`vgpud_operation_duration_seconds_count{op="create",outcome="success"} == 5`, "five create durations"},
		{`vgpud_operations_total{op="destroy",outcome="success"} == 1`, "a destroy counted"},
		{`vgpud_operation_duration_seconds_count{op="destroy",outcome="success"} == 1`, "a destroy duration"},
		{`vgpud_operation_duration_seconds_sum{op="destroy",outcome="success"} > 0`, "a destroy that took time"},
	} {
		res, err := metricsPromQuery(t, promURL, want.expr)
		if err != nil || len(res.Data.Result) == 0 {
			t.Errorf("want %s: %s returned nothing (%v)", want.what, want.expr, err)
		}
	}
}

// skipMissing skips a test whose service binary is absent, or fails it
// where CI installs every service (VGPUD_TEST_REQUIRE_SERVICES=1).
func skipMissing(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("VGPUD_TEST_REQUIRE_SERVICES") == "1" {
		t.Fatalf("%s, and VGPUD_TEST_REQUIRE_SERVICES=1", why)
	}
	t.Skip("skipping: " + why)
}
