package metrics_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/vgpud/vgpud/pkg/metrics"
	"github.com/vgpud/vgpud/pkg/share"
)

// dcgmHost is two GPUs as NVML numbers them: a MIG H100 with a MIG
// instance and a MIG-backed vGPU, and an L4 with a time-sliced vGPU.
func dcgmHost() share.Inventory {
	return share.Inventory{
		GPUs: []share.GPU{
			{Index: 0, UUID: "GPU-l4", PCI: "0000:3b:00.0", Model: "L4-24GB", State: "ok", Flavour: "mdev"},
			{Index: 1, UUID: "GPU-h100", PCI: "0000:41:00.0", Model: "H100-SXM5-80GB", MIG: true, State: "ok", MIGSlots: 8},
		},
		Instances: []share.Instance{
			{UUID: "i-mig", Tenant: "acme", GPU: "GPU-h100", Kind: share.MIG, RecordKind: "mig", Profile: "3g.40gb", GI: 2, GIStart: 4, GISize: 4, State: "ready"},
			{UUID: "i-migvgpu", Tenant: "acme", GPU: "GPU-h100", Kind: share.MIG, RecordKind: "mig-vgpu", Profile: "H100-1-10C", GI: 9, GIStart: 0, GISize: 1, State: "ready"},
			{UUID: "i-ts", Tenant: "crunch", GPU: "GPU-l4", Kind: share.TimeSliced, RecordKind: "vgpu", Profile: "L4-12C", GI: -1, State: "ready"},
		},
		Tenants: []share.Tenant{{Name: "acme", Guaranteed: true}, {Name: "crunch"}},
	}
}

func collected(t *testing.T) *metrics.Collector {
	t.Helper()
	now := time.Unix(1_800_000_000, 0)
	c, err := metrics.New(metrics.Config{Source: &blockingSource{inv: dcgmHost()}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.ObserveNVML("DeviceGetCount", 3*time.Microsecond, "")
	c.ObserveNVML("GetVgpuSchedulerLog", 40*time.Microsecond, "")
	c.ObserveNVML("SetVgpuSchedulerState", 90*time.Microsecond, "not_supported")
	c.Observe(metrics.Event{Kind: metrics.EventXID, GPU: "GPU-h100", XID: 13})
	now = now.Add(1500 * time.Millisecond)
	return c
}

func get(t *testing.T, c *metrics.Collector, accept, encoding string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	if encoding != "" {
		req.Header.Set("Accept-Encoding", encoding)
	}
	rec := httptest.NewRecorder()
	c.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("GET Accept %q Accept-Encoding %q: %d %s", accept, encoding, rec.Code, rec.Body.String())
	}
	return rec
}

// sampleNames returns the metric names of a text or OpenMetrics body's
// samples (histogram series under their family's name).
func sampleNames(body []byte) map[string]bool {
	out := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		n := l[:strings.IndexAny(l, "{ ")]
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			n = strings.TrimSuffix(n, suf)
		}
		out[n] = true
	}
	return out
}

func sorted(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Every format and encoding promhttp negotiates carries every family the
// plain text scrape does, the collection age included (a second gzip
// member once hid it from libcurl).
func TestNegotiatedExpositions(t *testing.T) {
	c := collected(t)
	plain := get(t, c, "", "")
	if ct := plain.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("plain scrape Content-Type %q", ct)
	}
	want := sampleNames(plain.Body.Bytes())
	if !want["vgpud_collection_age_seconds"] || !want["vgpud_nvml_call_duration_seconds"] || !want["vgpud_instance_info"] {
		t.Fatalf("plain scrape lacks families: %v", sorted(want))
	}
	same := func(what string, body []byte) {
		t.Helper()
		got := sampleNames(body)
		for n := range want {
			if !got[n] {
				t.Errorf("%s: no %s", what, n)
			}
		}
	}

	gz := get(t, c, "", "gzip")
	if gz.Header().Get("Content-Encoding") != "gzip" {
		t.Fatalf("gzip scrape: %v", gz.Header())
	}
	// One gzip member: a reader that stops after the first sees it all.
	zr, err := gzip.NewReader(gz.Body)
	if err != nil {
		t.Fatal(err)
	}
	zr.Multistream(false)
	body, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if rest, _ := io.ReadAll(gz.Body); len(rest) != 0 {
		t.Errorf("gzip scrape has %d bytes after its first member", len(rest))
	}
	same("gzip", body)

	zs := get(t, c, "", "zstd")
	if zs.Header().Get("Content-Encoding") != "zstd" {
		t.Fatalf("zstd scrape: %v", zs.Header())
	}
	zd, err := zstd.NewReader(zs.Body)
	if err != nil {
		t.Fatal(err)
	}
	body, err = io.ReadAll(zd)
	zd.Close()
	if err != nil {
		t.Fatal(err)
	}
	same("zstd", body)

	om := get(t, c, "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5", "")
	if ct := om.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.Errorf("OpenMetrics scrape Content-Type %q", ct)
	}
	if !bytes.HasSuffix(om.Body.Bytes(), []byte("# EOF\n")) {
		t.Error("OpenMetrics scrape does not end with # EOF")
	}
	same("OpenMetrics", om.Body.Bytes())

	// Protobuf, as Prometheus asks for it with native histograms on.
	pb := get(t, c, "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3", "")
	dec := expfmt.NewDecoder(bytes.NewReader(pb.Body.Bytes()), expfmt.NewFormat(expfmt.TypeProtoDelim))
	got := map[string]*dto.MetricFamily{}
	for {
		var mf dto.MetricFamily
		if err := dec.Decode(&mf); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("protobuf scrape: %v", err)
		}
		got[mf.GetName()] = &mf
	}
	for n := range want {
		if got[n] == nil {
			t.Errorf("protobuf: no %s", n)
		}
	}
	native := false
	for _, m := range got["vgpud_nvml_call_duration_seconds"].GetMetric() {
		h := m.GetHistogram()
		if h.Schema != nil && len(h.GetPositiveSpan()) > 0 && len(h.GetBucket()) > 0 {
			native = true // native buckets beside the classic ones
		}
	}
	if !native {
		t.Error("protobuf: vgpud_nvml_call_duration_seconds has no native histogram")
	}
	if age := got["vgpud_collection_age_seconds"].GetMetric(); len(age) != 1 || age[0].GetGauge().GetValue() != 1.5 {
		t.Errorf("protobuf: collection age %v, want 1.5", age)
	}
}

// GPU series carry dcgm-exporter's labels; MIG instance info its GPU
// instance labels; kinds are named as vgpuctl names them.
func TestDCGMLabels(t *testing.T) {
	mfs := parse(t, scrape(t, collected(t)))
	for _, want := range []struct {
		name string
		lbl  map[string]string
	}{
		{"vgpud_gpu_info", map[string]string{"gpu": "1", "UUID": "GPU-h100", "pci_bus_id": "00000000:41:00.0", "model": "H100-SXM5-80GB"}},
		{"vgpud_gpu_info", map[string]string{"gpu": "0", "UUID": "GPU-l4", "pci_bus_id": "00000000:3B:00.0"}},
		{"vgpud_gpu_framebuffer_allocated_bytes", map[string]string{"gpu": "1", "UUID": "GPU-h100", "pci_bus_id": "00000000:41:00.0"}},
		{"vgpud_gpu_mig_slot_occupied", map[string]string{"gpu": "1", "UUID": "GPU-h100", "slot": "5", "instance_uuid": "i-mig"}},
		{"vgpud_xid_events_total", map[string]string{"gpu": "1", "UUID": "GPU-h100", "pci_bus_id": "00000000:41:00.0", "xid": "13"}},
		{"vgpud_gpu_lost_events_total", map[string]string{"gpu": "0", "UUID": "GPU-l4", "pci_bus_id": "00000000:3B:00.0"}},
		{"vgpud_instance_info", map[string]string{"instance_uuid": "i-mig", "gpu": "1", "UUID": "GPU-h100", "pci_bus_id": "00000000:41:00.0",
			"GPU_I_ID": "2", "GPU_I_PROFILE": "3g.40gb", "kind": "mig"}},
		{"vgpud_instance_info", map[string]string{"instance_uuid": "i-migvgpu", "GPU_I_ID": "9", "kind": "mig-vgpu", "profile": "H100-1-10C"}},
		{"vgpud_instance_info", map[string]string{"instance_uuid": "i-ts", "gpu": "0", "UUID": "GPU-l4", "kind": "vgpu"}},
		{"vgpud_instance_framebuffer_total_bytes", map[string]string{"instance_uuid": "i-ts", "gpu": "0", "UUID": "GPU-l4"}},
	} {
		if _, ok := value(mfs, want.name, want.lbl); !ok {
			t.Errorf("no %s%v", want.name, want.lbl)
		}
	}
	for _, m := range mfs["vgpud_instance_info"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "kind" && l.GetValue() == "time-sliced" {
				t.Error("instance kind time-sliced: vgpuctl and D-Bus say vgpu")
			}
		}
		id := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == "instance_uuid" {
				id = l.GetValue()
			}
			if id == "i-ts" && strings.HasPrefix(l.GetName(), "GPU_I_") || id == "i-migvgpu" && l.GetName() == "GPU_I_PROFILE" {
				t.Errorf("%s has %s=%q: not a MIG GPU instance profile DCGM would name", id, l.GetName(), l.GetValue())
			}
		}
	}
}

// The cached responses are what promhttp writes for the Gatherer, in
// every format, plain and gzip.
func TestCachedResponsesArePromhttps(t *testing.T) {
	c := collected(t)
	prom := promhttp.HandlerFor(c, promhttp.HandlerOpts{EnableOpenMetrics: true})
	for _, accept := range []string{
		"",
		"text/plain;version=0.0.4",
		"application/openmetrics-text;version=1.0.0",
		"application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
		"application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3",
	} {
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		req.Header.Set("Accept", accept)
		want := httptest.NewRecorder()
		prom.ServeHTTP(want, req)
		for _, coding := range []string{"", "gzip", "br, gzip;q=0.9, zstd;q=0.5"} {
			got := get(t, c, accept, coding)
			body := got.Body.Bytes()
			if coding != "" {
				if got.Header().Get("Content-Encoding") != "gzip" {
					t.Fatalf("Accept-Encoding %q: %v", coding, got.Header())
				}
				zr, err := gzip.NewReader(got.Body)
				if err != nil {
					t.Fatal(err)
				}
				zr.Multistream(false)
				if body, err = io.ReadAll(zr); err != nil {
					t.Fatalf("Accept %q, gzip: %v", accept, err)
				}
			}
			if got.Header().Get("Content-Type") != want.Header().Get("Content-Type") || !bytes.Equal(body, want.Body.Bytes()) {
				t.Errorf("Accept %q, Accept-Encoding %q: %s, %d bytes; promhttp: %s, %d bytes",
					accept, coding, got.Header().Get("Content-Type"), len(body), want.Header().Get("Content-Type"), want.Body.Len())
			}
		}
	}
}

func TestContentCoding(t *testing.T) {
	for h, want := range map[string]string{
		"":                              "identity",
		"gzip":                          "gzip",
		"zstd":                          "zstd",
		"deflate, gzip, br, zstd":       "gzip",
		"gzip;q=0.5, zstd":              "zstd",
		"gzip;q=0, identity":            "identity",
		"*":                             "gzip",
		"*;q=0.2, zstd;q=0.8":           "zstd",
		"br":                            "identity",
		" GZIP ; q=0.9 , zstd ; q=0.1 ": "gzip",
		"gzip;q=bogus":                  "gzip",
	} {
		if got := metrics.ContentCoding(h); got != want {
			t.Errorf("Accept-Encoding %q: %s, want %s", h, got, want)
		}
	}
}
