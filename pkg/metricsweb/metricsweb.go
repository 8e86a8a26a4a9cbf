// Package metricsweb decides who may read the metrics endpoint. It serves
// tenant names and instance UUIDs, which the D-Bus policy shows to members
// of group vgpud only; who may read them is the operator's choice: the
// listen address (loopback by default), a Unix socket with a mode and
// group (Listen), and the Prometheus exporters' web configuration file
// (exporter-toolkit's format: TLS, client certificates, basic auth with
// bcrypt hashes, response headers, a rate limit), as node_exporter's
// --web.config.file reads it (Load), enforced per connection and request
// by a Gate that a reload points at a new reading.
//
// It knows nothing of the metrics themselves: the daemon puts pkg/metrics'
// handler behind the Gate.
//
// Imports: nothing from vgpud.
package metricsweb

import (
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/exporter-toolkit/web"
	"go.yaml.in/yaml/v2"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/time/rate"
)

// ErrAccess is wrapped by every error of the metrics endpoint's
// access settings (web configuration file, Unix socket).
var ErrAccess = errors.New("metrics endpoint access")

// maxConfigSize bounds the web configuration file: it is a few lines.
const maxConfigSize = 1 << 20

// UnixPrefix marks a metricsListen that is a Unix socket path.
const UnixPrefix = "unix:"

// Web is one reading of the web configuration file: what the
// endpoint enforces until the next reload. Certificates, keys and client
// CAs are read when the file is, not at each connection, so a reload
// that fails keeps serving with what the last good one read.
type Web struct {
	file string
	// tls is nil for plain HTTP.
	tls *tls.Config
	// users maps a basic-auth user to its bcrypt hash; none: no auth.
	users   map[string][]byte
	headers map[string]string
	limiter *rate.Limiter
	// auth caches bcrypt comparisons (each costs tens of milliseconds at
	// cost 10, once a scrape otherwise): keyed by a hash of user,
	// password and bcrypt hash, so no password is kept as it came.
	authMu sync.Mutex
	auth   map[[32]byte]bool
	// bcryptMu runs one comparison at a time: a flood of wrong
	// passwords costs one core, not all of them.
	bcryptMu sync.Mutex
}

// File is the web configuration file read ("": none, plain HTTP).
func (w *Web) File() string { return w.file }

// TLS reports whether the endpoint serves TLS.
func (w *Web) TLS() bool { return w.tls != nil }

// Users is how many basic-auth users the file names (0: no auth).
func (w *Web) Users() int { return len(w.users) }

// authCacheSize bounds the comparison cache; it is emptied when full.
const authCacheSize = 100

// fakeHash is compared for an unknown user, so that a wrong user name
// takes as long as a wrong password (no user enumeration by timing). A
// constant (bcrypt of "vgpud: no such user", cost 10): made at start it
// would cost every vgpud command, sim verbs included, a bcrypt round.
var fakeHash = []byte("$2a$10$60GWJG0/HvjIwWW9A2iwwex7CNTu/aEbwxREQUlG54ziVPjDL.VIe")

// Load reads a web configuration file; "" is plain HTTP for everyone who
// can connect. Errors name the file and the key and wrap ErrAccess.
func Load(path string) (*Web, error) {
	w := &Web{file: path}
	if path == "" {
		return w, nil
	}
	fail := func(format string, a ...any) (*Web, error) {
		return nil, fmt.Errorf("%w: metricsWebConfigFile %s: %s", ErrAccess, path, fmt.Sprintf(format, a...))
	}
	data, err := readSmallFile(path, maxConfigSize)
	if err != nil {
		return fail("%v", err)
	}
	// exporter-toolkit's defaults and strict parsing, as its Serve reads
	// the file.
	c := web.Config{
		TLSConfig:  web.TLSConfig{MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS13},
		HTTPConfig: web.HTTPConfig{HTTP2: true},
	}
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return fail("%v", err)
	}
	c.TLSConfig.SetDirectory(filepath.Dir(path))
	names := make([]string, 0, len(c.Users))
	for u := range c.Users {
		names = append(names, u)
	}
	sort.Strings(names)
	w.users = map[string][]byte{}
	for _, u := range names {
		h := []byte(c.Users[u])
		if _, err := bcrypt.Cost(h); err != nil {
			return fail("basic_auth_users: %q: not a bcrypt hash (make one with htpasswd -nBC 10 %s): %v", u, u, err)
		}
		w.users[u] = h
	}
	if c.RateLimiterConfig.Interval < 0 || c.RateLimiterConfig.Burst < 0 {
		return fail("rate_limit: interval and burst must not be negative")
	}
	if c.RateLimiterConfig.Interval > 0 {
		if c.RateLimiterConfig.Burst == 0 {
			return fail("rate_limit: burst must be at least 1 with an interval (0 refuses every scrape)")
		}
		w.limiter = rate.NewLimiter(rate.Every(c.RateLimiterConfig.Interval), c.RateLimiterConfig.Burst)
	}
	if c.TLSConfig.IsEnabled() {
		// The toolkit reads these with os.ReadFile, which waits forever on
		// a FIFO and reads a device without end: check them first.
		for _, f := range []struct{ key, path string }{
			{"cert_file", c.TLSConfig.TLSCertPath}, {"key_file", c.TLSConfig.TLSKeyPath}, {"client_ca_file", c.TLSConfig.ClientCAs},
		} {
			if f.path == "" {
				continue
			}
			if st, err := os.Stat(f.path); err == nil && !st.Mode().IsRegular() {
				return fail("tls_server_config: %s %s: not a regular file (%s)", f.key, f.path, st.Mode().Type())
			} else if err == nil && st.Size() > maxConfigSize {
				return fail("tls_server_config: %s %s: %d bytes; at most %d", f.key, f.path, st.Size(), maxConfigSize)
			}
		}
		cfg, err := web.ConfigToTLSConfig(&c.TLSConfig)
		if err != nil {
			return fail("tls_server_config: %v", err)
		}
		// Read the certificate now, once: the toolkit's callback reads
		// the files at every handshake, which would let a half-written
		// renewal break scrapes that the running configuration serves.
		cert, err := cfg.GetCertificate(nil)
		if err != nil {
			return fail("tls_server_config: %v", err)
		}
		cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert, nil }
		// HTTP/1.1 only: the endpoint serves one small response a scrape.
		cfg.NextProtos = []string{"http/1.1"}
		w.tls = cfg
	}
	// What the toolkit checks beyond the above (the headers a file may
	// set and their values), so that a file vgpud takes is one
	// exporter-toolkit takes.
	if err := web.Validate(path); err != nil {
		return fail("%v", err)
	}
	w.headers = c.HTTPConfig.Header
	return w, nil
}

// readSmallFile reads a regular file of at most limit bytes. It opens
// without blocking, so a FIFO put at the path is refused rather than
// waited on, and checks what it opened, so a device (/dev/zero) is too.
func readSmallFile(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%s)", st.Mode().Type())
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("%d bytes; at most %d", st.Size(), limit)
	}
	data := make([]byte, st.Size())
	n, err := f.ReadAt(data, 0)
	if err != nil && n != len(data) {
		return nil, err
	}
	return data, nil
}

// authorized reports whether r carries a user and password of the file.
func (w *Web) authorized(r *http.Request) bool {
	user, pass, ok := r.BasicAuth()
	if !ok {
		return false
	}
	hash, known := w.users[user]
	if !known {
		hash = fakeHash
	}
	h := sha256.New()
	for _, s := range []string{user, pass} {
		h.Write([]byte(strconv.Itoa(len(s))))
		h.Write([]byte{0})
		h.Write([]byte(s))
	}
	h.Write(hash)
	var key [32]byte
	copy(key[:], h.Sum(nil))
	w.authMu.Lock()
	okc, cached := w.auth[key]
	w.authMu.Unlock()
	if cached {
		return okc && known
	}
	w.bcryptMu.Lock()
	okc = bcrypt.CompareHashAndPassword(hash, []byte(pass)) == nil
	w.bcryptMu.Unlock()
	w.authMu.Lock()
	if w.auth == nil || len(w.auth) >= authCacheSize {
		w.auth = map[[32]byte]bool{}
	}
	w.auth[key] = okc
	w.authMu.Unlock()
	return okc && known
}

// Gate serves the metrics endpoint under the web configuration in
// force; a reload replaces it (Set) for the next connection and request.
type Gate struct {
	cur  atomic.Pointer[Web]
	next http.Handler
}

func NewGate(w *Web, next http.Handler) *Gate {
	g := &Gate{next: next}
	g.cur.Store(w)
	return g
}

func (g *Gate) Set(w *Web) { g.cur.Store(w) }

func (g *Gate) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	w := g.cur.Load()
	if w.limiter != nil && !w.limiter.Allow() {
		http.Error(rw, http.StatusText(http.StatusTooManyRequests), http.StatusTooManyRequests)
		return
	}
	for k, v := range w.headers {
		rw.Header().Set(k, v)
	}
	// A connection accepted before a reload turned TLS on is plain: it
	// gets nothing the policy in force would not give it.
	if w.tls != nil && r.TLS == nil {
		http.Error(rw, "TLS required", http.StatusBadRequest)
		return
	}
	if len(w.users) > 0 && !w.authorized(r) {
		rw.Header().Set("WWW-Authenticate", `Basic realm="vgpud metrics", charset="UTF-8"`)
		http.Error(rw, http.StatusText(http.StatusUnauthorized), http.StatusUnauthorized)
		return
	}
	g.next.ServeHTTP(rw, r)
}

// listener wraps ln so that each connection accepted is TLS when the web
// configuration in force says so (the HTTP server runs the handshake).
func (g *Gate) Listener(ln net.Listener) net.Listener { return gateListener{ln, g} }

type gateListener struct {
	net.Listener
	g *Gate
}

func (l gateListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if cfg := l.g.cur.Load().tls; cfg != nil {
		return tls.Server(c, cfg), nil
	}
	return c, nil
}

// Listen binds the endpoint's address (metricsListen): host:port, or
// unix:PATH made with mode and group (metricsSocketMode and
// metricsSocketGroup; group "" is the daemon's).
func Listen(addr string, mode fs.FileMode, group string) (net.Listener, error) {
	path, isUnix := strings.CutPrefix(addr, UnixPrefix)
	if !isUnix {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("metrics endpoint %s: %w", addr, err)
		}
		return ln, nil
	}
	ln, err := listenUnixSocket(path, mode, group)
	if err != nil {
		return nil, fmt.Errorf("metrics endpoint %s: %w", addr, err)
	}
	return ln, nil
}

// listenUnixSocket makes a Unix socket at path with mode and group ("":
// the daemon's own). It is made under a temporary name, given its mode
// and group, then renamed into place, so no one connects to it while its
// permissions are still the umask's. A socket left by a daemon that died
// is replaced; a path that is not a socket, or a socket something
// answers on, is refused.
func listenUnixSocket(path string, mode fs.FileMode, group string) (net.Listener, error) {
	gid := -1
	if group != "" {
		g, err := lookupGroup(group)
		if err != nil {
			return nil, fmt.Errorf("%w: metricsSocketGroup %q: %v", ErrAccess, group, err)
		}
		gid = g
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%w: %s exists and is not a socket (%s); not replaced", ErrAccess, path, st.Mode().Type())
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%w: %s: another process serves on it", ErrAccess, path)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".new")
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	undo := func(err error) (net.Listener, error) {
		ln.Close()
		os.Remove(tmp)
		return nil, err
	}
	// A socket made in a set-group-ID directory has the directory's group
	// already: /run/vgpud, which tmpfiles.d makes root:vgpud 2750. Then
	// no chown is needed, which the unit could not do (no CAP_CHOWN, and
	// @chown is among the system calls it filters).
	if st, err := os.Lstat(tmp); err != nil {
		return undo(err)
	} else if sys, ok := st.Sys().(*syscall.Stat_t); gid >= 0 && (!ok || int(sys.Gid) != gid) {
		if err := os.Chown(tmp, -1, gid); err != nil {
			return undo(fmt.Errorf("%w: metricsSocketGroup %q: %v (vgpud under its unit cannot change a file's group: put the socket in /run/vgpud, whose group is vgpud)", ErrAccess, group, err))
		}
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return undo(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return undo(err)
	}
	ino, _ := inode(path)
	return &unixSocket{UnixListener: ln, path: path, ino: ino}, nil
}

// unixSocket removes its path when closed, as a listener net.Listen made
// would, under the name it was renamed to; only if the path is still
// this socket (not one a later daemon made there).
type unixSocket struct {
	*net.UnixListener
	path string
	ino  uint64
	once sync.Once
}

func (u *unixSocket) Addr() net.Addr { return &net.UnixAddr{Name: u.path, Net: "unix"} }

func (u *unixSocket) Close() error {
	err := u.UnixListener.Close()
	u.once.Do(func() {
		if ino, ok := inode(u.path); ok && ino == u.ino {
			os.Remove(u.path)
		}
	})
	return err
}

// inode is path's inode number (not following a symlink).
func inode(path string) (uint64, bool) {
	st, err := os.Lstat(path)
	if err != nil {
		return 0, false
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return sys.Ino, true
}

// lookupGroup is a group name's or number's gid.
func lookupGroup(name string) (int, error) {
	if n, err := strconv.Atoi(name); err == nil && n >= 0 {
		return n, nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(g.Gid)
}
