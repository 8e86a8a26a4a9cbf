package e2e

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/vgpud/vgpud/internal/testenv"
	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
)

// accessCert writes a self-signed certificate for 127.0.0.1 and its key
// into dir; pool trusts it.
func accessCert(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	certFile, keyFile, cert := testenv.SelfSignedCert(t, dir)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func accessHash(t *testing.T, pass string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

// waitLog waits until p's log has want after offset (a byte count of the
// log before the action), and returns the log's length then.
func waitLog(t *testing.T, p *metricsProc, offset int, want string, within time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(p.log)
		if offset <= len(b) && bytes.Contains(b[offset:], []byte(want)) {
			return len(b)
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited:\n%s", p.name, metricsTail(string(b), 4000))
		case <-time.After(100 * time.Millisecond):
		}
	}
	b, _ := os.ReadFile(p.log)
	t.Fatalf("%s: no %q in its log within %v:\n%s", p.name, want, within, metricsTail(string(b[min(offset, len(b)):]), 4000))
	return 0
}

func logSize(p *metricsProc) int {
	b, _ := os.ReadFile(p.log)
	return len(b)
}

// TestMetricsBasicAuthTLS runs vgpud with a web configuration file of
// exporter-toolkit's format (TLS with a certificate made here, a basic-auth
// user): a scrape without credentials gets 401, a wrong password 401, plain
// HTTP 400, the right user 200; a real Prometheus scrapes it with the
// same credentials. SIGHUP with a broken file keeps the running policy and
// logs why; with a new password it takes it. A broken file at start is a
// named configuration error (exit status 2) before anything is bound.
func TestMetricsBasicAuthTLS(t *testing.T) {
	bus := testbus.Start(t)
	dir := t.TempDir()
	certFile, keyFile, pool := accessCert(t, dir)
	web := filepath.Join(dir, "web.yml")
	writeWeb := func(users string) {
		t.Helper()
		body := fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\nbasic_auth_users:\n%s", filepath.Base(certFile), filepath.Base(keyFile), users)
		if err := os.WriteFile(web, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeWeb("  prom: '" + accessHash(t, "s3cret") + "'\n")
	port := metricsFreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	args := []string{"--sim", "--state-dir", filepath.Join(dir, "state"), "--metrics-listen", addr,
		"--metrics-web-config-file", web, "--config", filepath.Join(dir, "vgpud.yaml"),
		"--bus-address", bus.Address(), "--libvirt-socket", "", "--log-level", "info"}
	if err := os.WriteFile(filepath.Join(dir, "vgpud.yaml"), []byte("version: v1\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	// A broken file stops the start with the file and key named.
	bad := filepath.Join(dir, "bad.yml")
	os.WriteFile(bad, []byte("tls_server_config:\n  cert_file: absent.pem\n  key_file: key.pem\n"), 0o600)
	out, err := exec.Command(vgpudBin, append(append([]string{}, args...), "--metrics-web-config-file", bad)...).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "metricsWebConfigFile "+bad+": tls_server_config: failed to read cert_file") {
		t.Fatalf("start with a missing certificate: %v\n%s", err, out)
	}

	vgpud := startMetricsProc(t, "vgpud", filepath.Join(dir, "vgpud.log"), bus.Env(), vgpudBin, args...)
	tlsClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	scrape := func(user, pass string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "https://"+addr+"/metrics", nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		r, err := tlsClient.Do(req)
		if err != nil {
			return 0, []byte(err.Error())
		}
		defer r.Body.Close()
		body, _ := io.ReadAll(r.Body)
		return r.StatusCode, body
	}
	deadline := time.Now().Add(60 * time.Second)
	for code, _ := scrape("prom", "s3cret"); code != http.StatusOK; code, _ = scrape("prom", "s3cret") {
		if time.Now().After(deadline) {
			t.Fatalf("no 200 with the right credentials within 60s (last %d)", code)
		}
		select {
		case <-vgpud.done:
			b, _ := os.ReadFile(vgpud.log)
			t.Fatalf("vgpud exited:\n%s", metricsTail(string(b), 4000))
		case <-time.After(200 * time.Millisecond):
		}
	}
	code, body := scrape("", "")
	if code != http.StatusUnauthorized || bytes.Contains(body, []byte("vgpud_")) {
		t.Fatalf("scrape without credentials: %d\n%s", code, metricsTail(string(body), 500))
	}
	if code, _ := scrape("prom", "wrong"); code != http.StatusUnauthorized {
		t.Fatalf("scrape with a wrong password: %d", code)
	}
	if code, body := scrape("prom", "s3cret"); code != http.StatusOK || !bytes.Contains(body, []byte("vgpud_build_info")) {
		t.Fatalf("scrape with the right credentials: %d\n%s", code, metricsTail(string(body), 500))
	}
	if r, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + "/metrics"); err == nil {
		r.Body.Close()
		if r.StatusCode != http.StatusBadRequest {
			t.Fatalf("plain HTTP to the TLS endpoint: %d", r.StatusCode)
		}
	}

	// Prometheus scrapes it with basic auth over TLS.
	if promBin, err := exec.LookPath("prometheus"); err != nil {
		t.Log("prometheus is not installed: the Prometheus scrape is skipped")
	} else {
		pport := metricsFreePort(t)
		promURL := fmt.Sprintf("http://127.0.0.1:%d", pport)
		cfg := fmt.Sprintf(`global: {scrape_interval: 1s}
scrape_configs:
  - job_name: vgpud
    scheme: https
    basic_auth: {username: prom, password: s3cret}
    tls_config: {ca_file: %q}
    static_configs: [{targets: [%q]}]
  - job_name: vgpud-no-auth
    scheme: https
    tls_config: {ca_file: %q}
    static_configs: [{targets: [%q]}]
`, certFile, addr, certFile, addr)
		cfgPath := filepath.Join(dir, "prometheus.yml")
		os.WriteFile(cfgPath, []byte(cfg), 0o644)
		prom := startMetricsProc(t, "prometheus", filepath.Join(dir, "prometheus.log"), os.Environ(), promBin,
			"--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
			"--web.listen-address="+fmt.Sprintf("127.0.0.1:%d", pport), "--log.level=warn")
		metricsWaitHTTP(t, prom, promURL+"/-/ready", 60*time.Second)
		want := map[string]bool{`up{job="vgpud"} == 1`: false, `up{job="vgpud-no-auth"} == 0`: false, `vgpud_build_info{job="vgpud"}`: false}
		deadline := time.Now().Add(30 * time.Second)
		for left := len(want); left > 0 && time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			left = 0
			for q, ok := range want {
				if !ok {
					if res, err := metricsPromQuery(t, promURL, q); err == nil && len(res.Data.Result) > 0 {
						want[q] = true
					} else {
						left++
					}
				}
			}
		}
		for q, ok := range want {
			if !ok {
				t.Errorf("Prometheus: %s returned nothing within 30s", q)
			}
		}
	}

	// A reload with a broken file keeps the running policy, and says why.
	writeWeb("  prom: 's3cret'\n")
	mark := logSize(vgpud)
	vgpud.cmd.Process.Signal(syscall.SIGHUP)
	waitLog(t, vgpud, mark, `reload refused: metrics web configuration invalid; keeping the running one`, 20*time.Second)
	if b, _ := os.ReadFile(vgpud.log); !bytes.Contains(b[mark:], []byte(`basic_auth_users: \"prom\": not a bcrypt hash`)) {
		t.Fatalf("the refusal does not name the key:\n%s", b[mark:])
	}
	if code, _ := scrape("prom", "s3cret"); code != http.StatusOK {
		t.Fatalf("after a refused reload: %d, want the running credentials to work", code)
	}
	if code, _ := scrape("", ""); code != http.StatusUnauthorized {
		t.Fatalf("after a refused reload without credentials: %d", code)
	}
	// A reload with a new password takes it.
	writeWeb("  prom: '" + accessHash(t, "n3w") + "'\n")
	mark = logSize(vgpud)
	vgpud.cmd.Process.Signal(syscall.SIGHUP)
	waitLog(t, vgpud, mark, `metrics endpoint: web configuration applied`, 20*time.Second)
	if code, _ := scrape("prom", "n3w"); code != http.StatusOK {
		t.Fatalf("the new password after the reload: %d", code)
	}
	if code, _ := scrape("prom", "s3cret"); code != http.StatusUnauthorized {
		t.Fatalf("the old password after the reload: %d", code)
	}
}

// TestMetricsUnixSocket runs vgpud with its endpoint on a Unix socket of
// mode 0660 and group 65534, in a set-group-ID directory of that group as
// the unit's /run/vgpud is, without CAP_CHOWN as under the unit: a member
// of that group scrapes it, another unprivileged user cannot connect, and
// the socket goes when vgpud stops.
func TestMetricsUnixSocket(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to give the socket a group and to scrape as other users")
	}
	for _, bin := range []string{"setpriv", "curl"} {
		if _, err := exec.LookPath(bin); err != nil {
			skipMissing(t, bin+" is not installed")
		}
	}
	bus := testbus.Start(t)
	// A directory other users can traverse: the test's own is 0700.
	dir, err := os.MkdirTemp("", "vgpud-metrics-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// As tmpfiles.d makes /run/vgpud, with group 65534 for vgpud (and
	// others allowed to traverse, so that the socket's own mode is what
	// refuses them): set-group-ID, so the socket has the group without a
	// chown. vgpud runs without CAP_CHOWN, as under its unit.
	sockDir := filepath.Join(dir, "run")
	if err := os.Mkdir(sockDir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	os.Chown(sockDir, 0, 65534)
	if err := os.Chmod(sockDir, 0o755|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(sockDir, "metrics.sock")
	vgpud := startMetricsProc(t, "vgpud", filepath.Join(dir, "vgpud.log"), bus.Env(), "setpriv", "--bounding-set=-chown", vgpudBin,
		"--sim", "--state-dir", filepath.Join(dir, "state"), "--metrics-listen", "unix:"+sock,
		"--metrics-socket-mode", "0660", "--metrics-socket-group", "65534",
		"--bus-address", bus.Address(), "--libvirt-socket", "", "--log-level", "info")
	curl := func(uid, gid int) (string, error) {
		args := []string{fmt.Sprintf("--reuid=%d", uid), fmt.Sprintf("--regid=%d", gid), "--clear-groups",
			"curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", "--unix-socket", sock, "http://vgpud/metrics"}
		out, err := exec.Command("setpriv", args...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, err := curl(65534, 65534)
		if err == nil && code == "200" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("group 65534 could not scrape the socket within 60s: %s %v", code, err)
		}
		select {
		case <-vgpud.done:
			b, _ := os.ReadFile(vgpud.log)
			t.Fatalf("vgpud exited:\n%s", metricsTail(string(b), 4000))
		case <-time.After(200 * time.Millisecond):
		}
	}
	st, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Type() != os.ModeSocket || st.Mode().Perm() != 0o660 || st.Sys().(*syscall.Stat_t).Gid != 65534 || st.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("socket %v uid %d gid %d, want a socket 0660 root:65534", st.Mode(), st.Sys().(*syscall.Stat_t).Uid, st.Sys().(*syscall.Stat_t).Gid)
	}
	// curl exits 7, could not connect (connect(2) answers EACCES): the
	// same socket that served group 65534 just now.
	var ee *exec.ExitError
	if code, err := curl(65533, 65533); !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("a user outside the group: %s %v, want curl's could-not-connect", code, err)
	}
	if code, err := curl(65534, 65534); err != nil || code != "200" {
		t.Fatalf("group 65534 again: %s %v", code, err)
	}
	// Nothing listens on TCP: the socket is the only way in.
	if b, err := os.ReadFile(vgpud.log); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if strings.Contains(sc.Text(), "metrics endpoint listening") && !strings.Contains(sc.Text(), "addr="+sock) {
				t.Fatalf("endpoint: %s", sc.Text())
			}
		}
	}
	vgpud.cmd.Process.Signal(syscall.SIGTERM)
	<-vgpud.done
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the socket after vgpud stopped: %v", err)
	}
}

// TestMetricsOpenMetricsPromtool scrapes a running vgpud in OpenMetrics,
// as Prometheus negotiates it, and checks that each family is named once
// (client_golang's gauge go_memstats_alloc_bytes and counter
// go_memstats_alloc_bytes_total share the OpenMetrics family name
// go_memstats_alloc_bytes) and that promtool check metrics parses it.
// promtool lints with the classic text parser, which looks for a
// counter's HELP under its _total name; the only problem it may report is
// that, for a counter whose family HELP is there.
func TestMetricsOpenMetricsPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		skipMissing(t, "promtool is not installed (Debian package prometheus)")
	}
	bus := testbus.Start(t)
	dir := t.TempDir()
	port := metricsFreePort(t)
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	vgpud := startMetricsProc(t, "vgpud", filepath.Join(dir, "vgpud.log"), bus.Env(), vgpudBin,
		"--sim", "--state-dir", filepath.Join(dir, "state"), "--metrics-listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--bus-address", bus.Address(), "--libvirt-socket", "", "--log-level", "info")
	metricsWaitHTTP(t, vgpud, metricsURL, 60*time.Second)
	// The process families are gathered with the first collection; wait
	// for a second so that counters have moved.
	time.Sleep(1500 * time.Millisecond)
	req, _ := http.NewRequest(http.MethodGet, metricsURL, nil)
	req.Header.Set("Accept", "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=0.0.4;q=0.3")
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.Fatalf("Content-Type %q, want OpenMetrics", ct)
	}
	if !bytes.Contains(body, []byte("\ngo_memstats_alloc_bytes_total ")) || !bytes.Contains(body, []byte("\nvgpud_build_info")) {
		t.Fatalf("exposition lacks the Go collector's or vgpud's families:\n%s", metricsTail(string(body), 2000))
	}
	seen := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && f[0] == "#" && (f[1] == "HELP" || f[1] == "TYPE") {
			if seen[f[1]+" "+f[2]]++; seen[f[1]+" "+f[2]] == 2 {
				t.Errorf("two # %s %s lines", f[1], f[2])
			}
		}
	}
	check := exec.Command(promtool, "check", "metrics")
	check.Stdin = bytes.NewReader(body)
	out, _ := check.CombinedOutput()
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l == "" {
			continue
		}
		name, ok := strings.CutSuffix(l, " no help text")
		family, counter := strings.CutSuffix(name, "_total")
		if !ok || !counter || seen["HELP "+family] != 1 || seen["TYPE "+family] != 1 {
			t.Errorf("promtool check metrics: %s", l)
		}
	}
}
