package metricsweb

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/vgpud/vgpud/internal/testenv"
)

func bcryptHash(t testing.TB, pass string) string {
	t.Helper()
	// The lowest cost: the tests compare hashes, not their strength.
	h, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

// The web configuration file: each mistake is an error naming the file
// and the key, and nothing is half taken.
func TestLoadMetricsWeb(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, _ := testenv.SelfSignedCert(t, dir)
	otherDir := t.TempDir()
	_, otherKey, _ := testenv.SelfSignedCert(t, otherDir)
	hash := bcryptHash(t, "s3cret")
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	unreadable := write("unreadable.yml", "basic_auth_users: {}\n")
	for _, tt := range []struct {
		name, file, want string
	}{
		{name: "missing", file: filepath.Join(dir, "absent.yml"), want: "no such file or directory"},
		{name: "directory", file: dir, want: "not a regular file"},
		{name: "fifo", file: func() string {
			p := filepath.Join(dir, "fifo")
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		}(), want: "not a regular file"},
		{name: "device", file: func() string {
			p := filepath.Join(dir, "zero.yml")
			if err := os.Symlink("/dev/zero", p); err != nil {
				t.Fatal(err)
			}
			return p
		}(), want: "not a regular file"},
		{name: "huge", file: write("huge.yml", "#"+strings.Repeat("x", maxConfigSize)+"\n"), want: "at most 1048576"},
		{name: "yaml", file: write("bad.yml", "basic_auth_users: [\n"), want: "yaml"},
		{name: "unknown-key", file: write("unknown.yml", "basic_auth_user:\n  a: b\n"), want: "basic_auth_user"},
		{name: "bad-hash", file: write("hash.yml", "basic_auth_users:\n  prom: s3cret\n"), want: `basic_auth_users: "prom": not a bcrypt hash`},
		{name: "missing-cert", file: write("nocert.yml", "tls_server_config:\n  cert_file: absent.pem\n  key_file: "+keyFile+"\n"), want: "tls_server_config: failed to read cert_file"},
		{name: "no-key", file: write("nokey.yml", "tls_server_config:\n  cert_file: "+certFile+"\n"), want: "tls_server_config: missing one of key or key_file"},
		{name: "key-mismatch", file: write("mismatch.yml", "tls_server_config:\n  cert_file: "+certFile+"\n  key_file: "+otherKey+"\n"), want: "tls_server_config: failed to load X509KeyPair"},
		{name: "client-auth", file: write("clientauth.yml", "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n  client_auth_type: Sometimes\n"), want: "invalid ClientAuth"},
		{name: "cert-fifo", file: func() string {
			p := filepath.Join(dir, "cert-fifo")
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
			return write("certfifo.yml", "tls_server_config:\n  cert_file: cert-fifo\n  key_file: key.pem\n")
		}(), want: "tls_server_config: cert_file " + filepath.Join(dir, "cert-fifo") + ": not a regular file"},
		{name: "key-device", file: write("keydev.yml", "tls_server_config:\n  cert_file: cert.pem\n  key_file: /dev/zero\n"), want: "key_file /dev/zero: not a regular file"},
		{name: "header", file: write("header.yml", "http_server_config:\n  headers:\n    X-Frame-Options: allow\n"), want: "X-Frame-Options"},
		{name: "header-not-allowed", file: write("header2.yml", "http_server_config:\n  headers:\n    Server: vgpud\n"), want: `"Server" can not be configured`},
		{name: "rate-no-burst", file: write("rate.yml", "rate_limit:\n  interval: 1s\n"), want: "rate_limit: burst must be at least 1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w, err := Load(tt.file)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "metricsWebConfigFile "+tt.file) || !errors.Is(err, ErrAccess) {
				t.Fatalf("Load: %v, %v; want an error naming the file and containing %q", w, err, tt.want)
			}
		})
	}
	t.Run("unreadable", func(t *testing.T) {
		if os.Geteuid() == 0 {
			// Root reads a 0000 file; a directory it cannot traverse is
			// what root is refused too little of. Check as another user.
			t.Skip("root reads any file")
		}
		os.Chmod(unreadable, 0)
		if _, err := Load(unreadable); err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Fatalf("unreadable: %v", err)
		}
	})

	w, err := Load("")
	if err != nil || w.tls != nil || len(w.users) != 0 {
		t.Fatalf("no file: %+v %v, want plain HTTP, no users", w, err)
	}
	// Relative certificate paths are the file's directory's, as
	// exporter-toolkit reads them.
	w, err = Load(write("good.yml", "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\nbasic_auth_users:\n  prom: '"+hash+"'\nhttp_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\nrate_limit:\n  interval: 1s\n  burst: 10\n"))
	if err != nil {
		t.Fatal(err)
	}
	if w.tls == nil || len(w.users) != 1 || w.headers["X-Content-Type-Options"] != "nosniff" || w.limiter == nil {
		t.Fatalf("good file: %+v", w)
	}
	// The certificate is the one read at load: replacing the files
	// changes nothing until a reload.
	before, _ := w.tls.GetCertificate(nil)
	os.WriteFile(certFile, []byte("garbage"), 0o644)
	after, err := w.tls.GetCertificate(nil)
	if err != nil || after != before {
		t.Fatalf("certificate after its file was replaced: %v, %v", after, err)
	}
}

// The gate: without credentials 401 with a Basic challenge, wrong ones
// 401, unknown users 401, right ones the handler; a new policy applies to
// the next request.
func TestMetricsGate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "web.yml")
	os.WriteFile(file, []byte("basic_auth_users:\n  prom: '"+bcryptHash(t, "s3cret")+"'\n"), 0o600)
	w, err := Load(file)
	if err != nil {
		t.Fatal(err)
	}
	// An unknown user costs a real bcrypt comparison, as a known one does.
	if cost, err := bcrypt.Cost(fakeHash); err != nil || cost != bcrypt.DefaultCost {
		t.Fatalf("fakeHash: cost %d, %v; want a bcrypt hash of cost %d", cost, err, bcrypt.DefaultCost)
	}
	g := NewGate(w, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { rw.Write([]byte("metrics")) }))
	do := func(user, pass string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		return rec
	}
	if rec := do("", ""); rec.Code != http.StatusUnauthorized || !strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Basic") || strings.Contains(rec.Body.String(), "metrics") {
		t.Fatalf("no credentials: %d %v %q", rec.Code, rec.Header(), rec.Body)
	}
	for i := 0; i < 2; i++ { // the second time from the cache
		if rec := do("prom", "wrong"); rec.Code != http.StatusUnauthorized {
			t.Fatalf("wrong password: %d", rec.Code)
		}
		if rec := do("nobody", "s3cret"); rec.Code != http.StatusUnauthorized {
			t.Fatalf("unknown user: %d", rec.Code)
		}
		if rec := do("prom", "s3cret"); rec.Code != http.StatusOK || rec.Body.String() != "metrics" {
			t.Fatalf("right credentials: %d %q", rec.Code, rec.Body)
		}
	}
	open, _ := Load("")
	g.Set(open)
	if rec := do("", ""); rec.Code != http.StatusOK {
		t.Fatalf("after the policy was replaced by an open one: %d", rec.Code)
	}
	g.Set(w)
	if rec := do("", ""); rec.Code != http.StatusUnauthorized {
		t.Fatalf("after the policy came back: %d", rec.Code)
	}
}

// TLS end to end on a real listener: a plain HTTP request is refused, a
// client trusting the certificate gets through.
func TestMetricsGateTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, cert := testenv.SelfSignedCert(t, dir)
	file := filepath.Join(dir, "web.yml")
	os.WriteFile(file, []byte("tls_server_config:\n  cert_file: "+certFile+"\n  key_file: "+keyFile+"\n"), 0o600)
	w, err := Load(file)
	if err != nil {
		t.Fatal(err)
	}
	g := NewGate(w, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { rw.Write([]byte("metrics")) }))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(g.Listener(ln))
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	r, err := client.Get("https://" + ln.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusOK || r.TLS == nil {
		t.Fatalf("TLS scrape: %d", r.StatusCode)
	}
	r, err = (&http.Client{Timeout: 10 * time.Second}).Get("http://" + ln.Addr().String() + "/metrics")
	if err == nil {
		r.Body.Close()
		if r.StatusCode != http.StatusBadRequest {
			t.Fatalf("plain HTTP to the TLS endpoint: %d", r.StatusCode)
		}
	}
	// Reloaded to plain HTTP: the next connection is plain.
	open, _ := Load("")
	g.Set(open)
	r, err = (&http.Client{Timeout: 10 * time.Second}).Get("http://" + ln.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		t.Fatalf("plain HTTP after TLS was turned off: %d", r.StatusCode)
	}
}

// The Unix socket: made with the mode and group asked for, a stale one
// replaced, a live one or a file that is not a socket refused, removed
// on close.
func TestListenUnixSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "metrics.sock")
	gid := os.Getgid()
	ln, err := listenUnixSocket(path, 0o620, "")
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Type() != fs.ModeSocket || st.Mode().Perm() != 0o620 || int(st.Sys().(*syscall.Stat_t).Gid) != gid {
		t.Fatalf("socket %v gid %d, want a socket 0620 of gid %d", st.Mode(), st.Sys().(*syscall.Stat_t).Gid, gid)
	}
	if ln.Addr().String() != path {
		t.Fatalf("Addr %s, want %s", ln.Addr(), path)
	}
	if _, err := listenUnixSocket(path, 0o660, ""); err == nil || !strings.Contains(err.Error(), "another process serves on it") {
		t.Fatalf("second listener on a live socket: %v", err)
	}
	ln.Close()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket after close: %v", err)
	}

	// A socket nobody serves on (a daemon killed with -9) is replaced.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	ln, err = listenUnixSocket(path, 0o660, "")
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	ln.Close()

	notSock := filepath.Join(dir, "file")
	os.WriteFile(notSock, []byte("keep me"), 0o644)
	if _, err := listenUnixSocket(notSock, 0o660, ""); err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Fatalf("over a regular file: %v", err)
	}
	if b, _ := os.ReadFile(notSock); string(b) != "keep me" {
		t.Fatal("the regular file was replaced")
	}
	if _, err := listenUnixSocket(filepath.Join(dir, "s2"), 0o660, "no-such-group-vgpud-test"); err == nil || !strings.Contains(err.Error(), `metricsSocketGroup "no-such-group-vgpud-test"`) {
		t.Fatalf("unknown group: %v", err)
	}
	if _, err := listenUnixSocket(filepath.Join(dir, "absent", "s"), 0o660, ""); err == nil {
		t.Fatal("a socket in a missing directory was made")
	}
	if os.Geteuid() == 0 {
		// Root may give the socket any group.
		ln, err := listenUnixSocket(filepath.Join(dir, "g.sock"), 0o660, "65534")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		st, _ := os.Lstat(filepath.Join(dir, "g.sock"))
		if g := st.Sys().(*syscall.Stat_t).Gid; g != 65534 {
			t.Fatalf("socket gid %d, want 65534", g)
		}
	}
}
