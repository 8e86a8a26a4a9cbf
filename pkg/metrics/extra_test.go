package metrics_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/vgpud/vgpud/pkg/metrics"
)

// Families kept elsewhere (Config.Extra: the fleet sync's) are served in
// every format and encoding after the collection's, current at each scrape,
// and a gzip response stays one member with them inside.
func TestExtraFamiliesInEveryExposition(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vgpud_extra_test", Help: "A family kept outside the collector."})
	reg.MustRegister(g)
	now := time.Unix(1_800_000_000, 0)
	c, err := metrics.New(metrics.Config{Source: &blockingSource{inv: dcgmHost()}, Extra: reg, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, v := range []float64{3, 7} { // the second scrape sees the new value
		g.Set(v)
		for _, tc := range []struct{ name, accept, encoding string }{
			{"text", "", ""},
			{"text gzip", "", "gzip"},
			{"OpenMetrics", "application/openmetrics-text; version=1.0.0", ""},
			{"protobuf", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited", "gzip"},
			{"zstd", "", "zstd"},
		} {
			rec := get(t, c, tc.accept, tc.encoding)
			body := rec.Body.Bytes()
			switch rec.Header().Get("Content-Encoding") {
			case "gzip":
				zr, err := gzip.NewReader(bytes.NewReader(body))
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				zr.Multistream(false)
				if body, err = io.ReadAll(zr); err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
			case "zstd":
				zd, err := zstd.NewReader(bytes.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				body, err = io.ReadAll(zd)
				zd.Close()
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
			}
			if f := expfmt.ResponseFormat(rec.Header()); f.FormatType() != expfmt.TypeProtoDelim {
				// Text and OpenMetrics: the sample line itself.
				// (OpenMetrics writes 3 as 3.0.)
				if !bytes.Contains(body, []byte(fmt.Sprintf("\nvgpud_extra_test %g\n", v))) && !bytes.Contains(body, []byte(fmt.Sprintf("\nvgpud_extra_test %.1f\n", v))) {
					t.Fatalf("%s: no vgpud_extra_test %g in the scrape", tc.name, v)
				}
				for _, want := range []string{"\nvgpud_collection_age_seconds ", "\nvgpud_gpu_info{"} {
					if !bytes.Contains(body, []byte(want)) {
						t.Fatalf("%s: no %q in the scrape", tc.name, want)
					}
				}
				continue
			}
			got := map[string]*dto.MetricFamily{}
			dec := expfmt.NewDecoder(bytes.NewReader(body), expfmt.NewFormat(expfmt.TypeProtoDelim))
			for {
				var mf dto.MetricFamily
				if err := dec.Decode(&mf); err == io.EOF {
					break
				} else if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				got[mf.GetName()] = &mf
			}
			if m := got["vgpud_extra_test"].GetMetric(); len(m) != 1 || m[0].GetGauge().GetValue() != v {
				t.Fatalf("%s: vgpud_extra_test = %v, want %g", tc.name, m, v)
			}
			if got["vgpud_collection_age_seconds"] == nil || got["vgpud_gpu_info"] == nil {
				t.Fatalf("%s: the collection's families are missing beside the extra ones", tc.name)
			}
		}
	}
}

// A per-scrape tail longer than one stored deflate block (64 KiB) still
// makes one valid gzip member.
func TestLargeExtraTailInGzip(t *testing.T) {
	reg := prometheus.NewRegistry()
	v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vgpud_extra_wide", Help: "Many series."}, []string{"n"})
	reg.MustRegister(v)
	for i := 0; i < 4000; i++ { // ~30 bytes a line: ~120 KiB
		v.WithLabelValues(fmt.Sprintf("%06d", i)).Set(float64(i))
	}
	c, err := metrics.New(metrics.Config{Source: &blockingSource{inv: dcgmHost()}, Extra: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	plain := get(t, c, "", "").Body.Bytes()
	zr, err := gzip.NewReader(bytes.NewReader(get(t, c, "", "gzip").Body.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	zr.Multistream(false)
	body, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("gzip scrape with a %d-byte tail: %v", len(plain), err)
	}
	// The age differs between the two scrapes only in its value.
	if len(body) < 120_000 || !bytes.Contains(body, []byte("vgpud_extra_wide{n=\"003999\"} 3999\n")) {
		t.Fatalf("gzip scrape lost the tail: %d bytes", len(body))
	}
}
