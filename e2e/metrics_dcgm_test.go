package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/vgpud/vgpud/pkg/dbusapi"
)

// dcgmTarget serves a dcgm-exporter exposition as a second scrape target
// of the test's Prometheus. Its text is set once the instances exist.
type dcgmTarget struct {
	srv  *httptest.Server
	text atomic.Value // string
}

func startDCGMTarget(t *testing.T) *dcgmTarget {
	d := &dcgmTarget{}
	d.text.Store("")
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		io.WriteString(w, d.text.Load().(string))
	}))
	t.Cleanup(d.srv.Close)
	return d
}

func (d *dcgmTarget) hostPort() string { return strings.TrimPrefix(d.srv.URL, "http://") }

// dcgmGPU is a GPU as dcgm-exporter labels it, and its MIG instances'
// values (by GPU instance id).
type dcgmGPU struct {
	index       int
	uuid, busID string
	modelName   string
	fbUsedMiB   float64
	migs        []dcgmMIG
}

type dcgmMIG struct {
	gi                int
	profile           string
	fbUsedMiB, smActv float64
}

// dcgmExposition writes what dcgm-exporter serves for these GPUs, in its
// documented form (docs.nvidia.com, "DCGM-Exporter"; its README's
// sample): fields as DCGM_FI_* families, each series labelled gpu (the
// NVML index), UUID, pci_bus_id (eight-digit domain, upper case), device,
// modelName, Hostname, DCGM_FI_DRIVER_VERSION; on a MIG GPU one series
// per GPU instance with GPU_I_PROFILE and GPU_I_ID. Framebuffer is in MiB,
// profiling fields are ratios.
func dcgmExposition(gpus []dcgmGPU) string {
	var b strings.Builder
	labels := func(g dcgmGPU, m *dcgmMIG) string {
		s := fmt.Sprintf(`gpu="%d",UUID=%q,pci_bus_id=%q,device="nvidia%d",modelName=%q,Hostname="vgpud-e2e",DCGM_FI_DRIVER_VERSION="580.65.05"`,
			g.index, g.uuid, g.busID, g.index, g.modelName)
		if m != nil {
			s += fmt.Sprintf(`,GPU_I_PROFILE=%q,GPU_I_ID="%d"`, m.profile, m.gi)
		}
		return "{" + s + "}"
	}
	b.WriteString("# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n")
	for _, g := range gpus {
		fmt.Fprintf(&b, "DCGM_FI_DEV_GPU_TEMP%s %d\n", labels(g, nil), 40+g.index)
	}
	b.WriteString("# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n# TYPE DCGM_FI_DEV_FB_USED gauge\n")
	for _, g := range gpus {
		if len(g.migs) == 0 {
			fmt.Fprintf(&b, "DCGM_FI_DEV_FB_USED%s %g\n", labels(g, nil), g.fbUsedMiB)
		}
		for i := range g.migs {
			fmt.Fprintf(&b, "DCGM_FI_DEV_FB_USED%s %g\n", labels(g, &g.migs[i]), g.migs[i].fbUsedMiB)
		}
	}
	b.WriteString("# HELP DCGM_FI_PROF_SM_ACTIVE The ratio of cycles an SM has at least 1 warp assigned.\n# TYPE DCGM_FI_PROF_SM_ACTIVE gauge\n")
	for _, g := range gpus {
		for i := range g.migs {
			fmt.Fprintf(&b, "DCGM_FI_PROF_SM_ACTIVE%s %g\n", labels(g, &g.migs[i]), g.migs[i].smActv)
		}
	}
	return b.String()
}

// dcgmBusID is a PCI address as DCGM writes pciInfo.busId.
func dcgmBusID(pci string) string { return strings.ToUpper("0000" + pci) }

// hostGPUs reads the GPUs' NVML indexes and UUIDs as vgpuctl reports them.
func hostGPUs(t *testing.T, ctl func(args ...string) []byte) map[string]dbusapi.GPU {
	t.Helper()
	var l struct {
		Items []dbusapi.GPU `json:"items"`
	}
	if err := json.Unmarshal(ctl("gpus", "-o", "json"), &l); err != nil {
		t.Fatal(err)
	}
	out := map[string]dbusapi.GPU{}
	for _, g := range l.Items {
		out[g.PCI] = g
	}
	return out
}

// promSample is one instant-vector sample of the query API.
type promSample struct {
	Metric    map[string]string `json:"metric"`
	Value     [2]any            `json:"value"`
	Histogram json.RawMessage   `json:"histogram"`
}

func promSamples(t *testing.T, base, expr string) []promSample {
	t.Helper()
	res, err := metricsPromQuery(t, base, expr)
	if err != nil {
		t.Errorf("%s: %v", expr, err)
		return nil
	}
	var out []promSample
	for _, r := range res.Data.Result {
		var s promSample
		if err := json.Unmarshal(r, &s); err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		out = append(out, s)
	}
	return out
}

// checkDCGMJoins runs docs/metrics.md's joins of vgpud's series with
// dcgm-exporter's in the real Prometheus: the GPU labels match exactly,
// DCGM's framebuffer sums per tenant, DCGM's SM activity per MIG instance
// names its tenant and instance.
func checkDCGMJoins(t *testing.T, promURL string, gpus []dcgmGPU, migTenant map[int]string, migUUID map[int]string) {
	t.Helper()
	// Every GPU: vgpud's gpu, UUID and pci_bus_id are DCGM's.
	got := promSamples(t, promURL, `vgpud_gpu_info * on(gpu, UUID, pci_bus_id) group_left(modelName) DCGM_FI_DEV_GPU_TEMP`)
	if len(got) != len(gpus) {
		t.Errorf("GPU join on gpu, UUID, pci_bus_id: %d series, want %d: %+v", len(got), len(gpus), got)
	}
	// Per-tenant framebuffer from DCGM (MIG GPU instances).
	want := map[string]float64{}
	for _, g := range gpus {
		for _, m := range g.migs {
			want[migTenant[m.gi]] += m.fbUsedMiB * (1 << 20)
		}
	}
	fb := promSamples(t, promURL, `sum by (tenant) (DCGM_FI_DEV_FB_USED * 1048576 * on(UUID, GPU_I_ID) group_left(tenant) vgpud_instance_info{GPU_I_ID!=""})`)
	if len(fb) != len(want) {
		t.Errorf("per-tenant framebuffer from DCGM: %+v, want %v", fb, want)
	}
	for _, s := range fb {
		if v := fmt.Sprint(s.Value[1]); v != fmt.Sprint(want[s.Metric["tenant"]]) && v != fmt.Sprintf("%.0f", want[s.Metric["tenant"]]) {
			t.Errorf("tenant %s: DCGM framebuffer %s, want %.0f", s.Metric["tenant"], v, want[s.Metric["tenant"]])
		}
	}
	// Per-MIG-instance SM activity attributed to its tenant and instance.
	sm := promSamples(t, promURL, `DCGM_FI_PROF_SM_ACTIVE * on(UUID, GPU_I_ID) group_left(tenant, instance_uuid) vgpud_instance_info{GPU_I_ID!=""}`)
	n := 0
	for _, g := range gpus {
		n += len(g.migs)
	}
	if len(sm) != n {
		t.Errorf("SM activity by MIG instance: %d series, want %d: %+v", len(sm), n, sm)
	}
	for _, s := range sm {
		gi := 0
		fmt.Sscan(s.Metric["GPU_I_ID"], &gi)
		if s.Metric["tenant"] != migTenant[gi] || s.Metric["instance_uuid"] != migUUID[gi] || s.Metric["GPU_I_PROFILE"] == "" {
			t.Errorf("SM activity of GPU instance %d attributed to %s/%s, want %s/%s", gi, s.Metric["tenant"], s.Metric["instance_uuid"], migTenant[gi], migUUID[gi])
		}
	}
}

// textFamilies are the metric names of a text or OpenMetrics body's
// samples, histogram series under their family's name.
func textFamilies(body []byte) map[string]int {
	out := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		i := strings.IndexAny(l, "{ ")
		if i < 0 {
			continue
		}
		n := l[:i]
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			n = strings.TrimSuffix(n, suf)
		}
		out[n]++
	}
	return out
}

func keys(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkNegotiated scrapes vgpud with curl as scrapers do: --compressed
// (libcurl's gzip), zstd, OpenMetrics. Each sees every family the plain
// scrape has, the collection age once.
func checkNegotiated(t *testing.T, metricsURL string, plain []byte) {
	t.Helper()
	curl, err := exec.LookPath("curl")
	if err != nil {
		skipMissing(t, "curl is not installed")
	}
	want := textFamilies(plain)
	if want["vgpud_collection_age_seconds"] != 1 {
		t.Fatalf("plain scrape: %d collection age lines", want["vgpud_collection_age_seconds"])
	}
	fetch := func(args ...string) (headers string, body []byte) {
		t.Helper()
		var hdr bytes.Buffer
		cmd := exec.Command(curl, append([]string{"-sS", "--fail", "-D", "/dev/stderr"}, append(args, metricsURL)...)...)
		cmd.Stderr = &hdr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("curl %v: %v\n%s", args, err, hdr.String())
		}
		return strings.ToLower(hdr.String()), out
	}
	same := func(what string, body []byte) {
		t.Helper()
		got := textFamilies(body)
		for n := range want {
			if got[n] == 0 {
				t.Errorf("%s: no %s (has %v)", what, n, keys(got))
			}
		}
		if got["vgpud_collection_age_seconds"] != 1 {
			t.Errorf("%s: %d vgpud_collection_age_seconds lines, want 1", what, got["vgpud_collection_age_seconds"])
		}
	}
	hdr, body := fetch("--compressed")
	if !strings.Contains(hdr, "content-encoding: gzip") && !strings.Contains(hdr, "content-encoding: zstd") {
		t.Errorf("curl --compressed: not compressed:\n%s", hdr)
	}
	same("curl --compressed", body)

	hdr, body = fetch("-H", "Accept-Encoding: zstd")
	if !strings.Contains(hdr, "content-encoding: zstd") {
		t.Errorf("Accept-Encoding zstd: not zstd:\n%s", hdr)
	}
	zr, err := zstd.NewReader(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	body, err = io.ReadAll(zr)
	zr.Close()
	if err != nil {
		t.Fatalf("zstd body: %v", err)
	}
	same("curl zstd", body)

	hdr, body = fetch("-H", "Accept: application/openmetrics-text;version=1.0.0;q=0.9,text/plain;version=0.0.4;q=0.5")
	if !strings.Contains(hdr, "content-type: application/openmetrics-text") || !bytes.HasSuffix(body, []byte("# EOF\n")) {
		t.Errorf("OpenMetrics: %s, ends %q", hdr, body[max(0, len(body)-20):])
	}
	same("curl OpenMetrics", body)
}

// checkProtobufScrape: Prometheus, with native histograms on, scraped
// vgpud in protobuf: it holds every family the text scrape has (the
// collection age included), and the NVML latency as a native histogram.
func checkProtobufScrape(t *testing.T, promURL string, plain []byte) {
	t.Helper()
	have := map[string]bool{}
	for _, s := range promSamples(t, promURL, `count by (__name__) ({__name__=~"vgpud_.+", job="vgpud"})`) {
		have[s.Metric["__name__"]] = true
	}
	for n := range textFamilies(plain) {
		if !strings.HasPrefix(n, "vgpud_") {
			continue
		}
		if !have[n] && !have[n+"_bucket"] {
			t.Errorf("Prometheus (protobuf scrape) has no %s", n)
		}
	}
	native := promSamples(t, promURL, `vgpud_nvml_call_duration_seconds`)
	if len(native) == 0 || len(native[0].Histogram) == 0 {
		t.Errorf("vgpud_nvml_call_duration_seconds is not a native histogram in Prometheus: %+v", native)
	}
	if q := promSamples(t, promURL, `vgpud:nvml_call_duration_seconds:p99_5m`); len(q) == 0 {
		t.Error("the NVML p99 rule returns nothing from the native histogram")
	}
}
