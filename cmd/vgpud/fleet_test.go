package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestConfigFleetSection(t *testing.T) {
	c, err := loadWith(t, "version: v1\nfleet:\n  endpoint: http://127.0.0.1:8778\n  host: gpu-7\n  syncInterval: 30s\n  grace: 90s\n  parentUUID: 9a0e0c3c-0d6f-4a11-8b2e-6f1c2b9e51d2\n")
	if err != nil {
		t.Fatal(err)
	}
	f := c.Fleet
	if f == nil || f.Endpoint != "http://127.0.0.1:8778" || f.Host != "gpu-7" || f.SyncInterval.Duration != 30*time.Second || f.Grace.Duration != 90*time.Second || f.ParentUUID == "" {
		t.Fatalf("fleet = %+v", f)
	}
	if _, err := loadWith(t, "version: v1\nfleet:\n  endpont: x\n"); err == nil {
		t.Fatal("a misspelt fleet key was accepted")
	}
	for _, bad := range []string{
		"fleet:\n  endpoint: placement:8778\n",
		"fleet:\n  endpoint: http://p:8778\n  parentUUID: nope\n",
		"fleet:\n  endpoint: http://p:8778\n  grace: -1s\n",
		"fleet:\n  endpoint: http://p:8778\n  rootUUID: 9a0e0c3c-0d6f-4a11-8b2e-6f1c2b9e51d2\n  parentUUID: 9a0e0c3c-0d6f-4a11-8b2e-6f1c2b9e51d3\n",
	} {
		if _, err := loadWith(t, "version: v1\n"+bad); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	if !reloadableKeys["fleet"] {
		t.Fatal("fleet is not applied on SIGHUP")
	}
}

// TestFleetMetricsFollow: one scrape serves pkg/metrics' families and the
// fleet's, even to a client that asks for gzip.
func TestFleetMetricsFollow(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vgpud_fleet_test", Help: "x"})
	reg.MustRegister(g)
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept-Encoding") != "" {
			t.Error("inner handler asked for an encoding")
		}
		io.WriteString(w, "vgpud_up 1\n")
	})
	srv := httptest.NewServer(withFleetMetrics(inner, reg))
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL, nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), "vgpud_up 1") || !strings.Contains(string(body), "vgpud_fleet_test 0") {
		t.Fatalf("scrape = %q", body)
	}
}
