package metrics_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/vgpud/vgpud/pkg/metrics"
)

// decoded is a response's body with its Content-Encoding undone.
func decoded(t *testing.T, rec *httptest.ResponseRecorder) []byte {
	t.Helper()
	var r io.Reader = rec.Body
	switch ce := rec.Header().Get("Content-Encoding"); ce {
	case "":
	case "gzip":
		zr, err := gzip.NewReader(rec.Body)
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	case "zstd":
		zd, err := zstd.NewReader(rec.Body)
		if err != nil {
			t.Fatal(err)
		}
		defer zd.Close()
		r = zd
	default:
		t.Fatalf("Content-Encoding %q", ce)
	}
	body, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// omFamilyLines counts, per family name, the HELP, TYPE and UNIT lines of
// an OpenMetrics body ("HELP go_x" -> 2 when two families share a name).
func omFamilyLines(body []byte) map[string]int {
	out := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && f[0] == "#" && (f[1] == "HELP" || f[1] == "TYPE" || f[1] == "UNIT") {
			out[f[1]+" "+f[2]]++
		}
	}
	return out
}

// The OpenMetrics exposition, with the process_* and go_* families the
// daemon serves, names each family once: OpenMetrics drops a counter's
// "_total" from its family name, and client_golang's Go collector serves a
// gauge go_memstats_alloc_bytes beside the counter
// go_memstats_alloc_bytes_total, which made two HELP and two TYPE lines
// for go_memstats_alloc_bytes and an exposition promtool refused.
func TestOpenMetricsFamiliesUnique(t *testing.T) {
	c, err := metrics.New(metrics.Config{Source: &blockingSource{inv: dcgmHost()}, Process: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, enc := range []string{"", "gzip", "zstd"} {
		body := decoded(t, get(t, c, "application/openmetrics-text; version=1.0.0", enc))
		if !bytes.Contains(body, []byte("\ngo_memstats_alloc_bytes_total ")) || !bytes.Contains(body, []byte("\ngo_memstats_heap_alloc_bytes ")) {
			t.Fatalf("encoding %q: the Go collector's allocation counter or heap gauge is missing:\n%s", enc, body)
		}
		for line, n := range omFamilyLines(body) {
			if n > 1 {
				t.Errorf("encoding %q: %d lines # %s", enc, n, line)
			}
		}
		if enc == "" {
			checkOpenMetricsPromtool(t, body)
		}
	}
}

// checkOpenMetricsPromtool runs promtool check metrics on an OpenMetrics
// body. promtool lints with the classic text parser: it must parse the
// body (two HELP lines for one name is a parse error), and the only
// problem it may report is "no help text" for a counter's _total series,
// whose HELP OpenMetrics writes under the family name without _total.
func checkOpenMetricsPromtool(t *testing.T, body []byte) {
	t.Helper()
	if _, err := exec.LookPath("promtool"); err != nil {
		t.Log("promtool not installed: promtool check metrics skipped (the e2e test runs it)")
		return
	}
	cmd := exec.Command("promtool", "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	out, _ := cmd.CombinedOutput()
	lines := omFamilyLines(body)
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l == "" {
			continue
		}
		name, ok := strings.CutSuffix(l, " no help text")
		family, counter := strings.CutSuffix(name, "_total")
		if !ok || !counter || lines["HELP "+family] != 1 || lines["TYPE "+family] != 1 {
			t.Errorf("promtool check metrics: %s", l)
		}
	}
}
