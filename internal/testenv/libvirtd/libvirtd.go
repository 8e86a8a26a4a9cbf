// Package libvirtd gives tests a real libvirtd with the QEMU driver: as root
// it starts virtlogd and libvirtd as child processes of its own, in a private
// mount namespace, and stops them at cleanup; otherwise it uses a libvirtd
// already answering on the default socket. StartPair starts two such
// libvirtds that libvirt takes for two hosts (own hostname in a UTS
// namespace, own host UUID), for migration tests (pair.go). It also defines
// tiny TCG domains that are undefined at cleanup.
//
// Only tests import it (pkg/virt's tests and the e2e suite).
//
// How libvirtd runs here (Debian 12, root, no systemd):
//
//   - A privileged libvirtd keeps its drivers' state at fixed paths
//     (/etc/libvirt/qemu, /run/libvirt/*/driver.pid, /var/lib/libvirt,
//     /var/cache/libvirt) whatever its configuration says, so two on one
//     machine collide: the second exits at start-up on the first one's
//     /run/libvirt/network/driver.pid. Start therefore runs virtlogd and
//     libvirtd in a mount namespace of their own (namespace.go), where
//     /etc/libvirt, /run/libvirt, /var/lib/libvirt, /var/cache/libvirt and
//     /var/log/libvirt are private directories of the Env; a system libvirtd
//     from the package, another test binary's Env or the demo may run at
//     the same time. The socket the harness and clients use is in the Env's
//     directory, outside those paths, so it is reached from outside the
//     namespace.
//   - The private /etc/libvirt holds a qemu.conf with user and group root,
//     which TCG guests need when libvirtd runs as root, and no network,
//     storage or nwfilter definitions: nothing is autostarted.
//   - A libvirtd already answering on the default socket is used only when
//     this process cannot start one (not root, or the packages missing);
//     then Start takes a machine-wide lock (flock on
//     /run/lock/vgpud-testenv-libvirtd.lock) for the life of the Env, so
//     test binaries sharing it take turns, and it removes domains that a
//     crashed earlier run left defined (they carry a marker in their
//     metadata; no other domain is touched).
//
// Tests skip, with the reason printed, when libvirtd, virtlogd,
// qemu-system-x86_64, unshare or nsenter is missing or the test does not run
// as root and no libvirtd answers. Setting VGPUD_TEST_REQUIRE_LIBVIRTD=1
// turns those skips into failures, for CI machines that install the
// packages. VGPUD_TEST_LIBVIRTD_LOG_FILTERS (libvirtd's log_filters syntax,
// e.g. "1:qemu 3:*") turns on debug logging in a libvirtd that Start runs;
// its log is printed when a test fails.
//
// Imports: nothing from vgpud.
package libvirtd

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
)

// DefaultSocket is where a system libvirtd listens.
const DefaultSocket = "/run/libvirt/libvirt-sock"

const (
	lockPath   = "/run/lock/vgpud-testenv-libvirtd.lock"
	requireEnv = "VGPUD_TEST_REQUIRE_LIBVIRTD"
	debugEnv   = "VGPUD_TEST_LIBVIRTD_LOG_FILTERS"

	readyTimeout = 60 * time.Second
	stopTimeout  = 20 * time.Second
	lockTimeout  = 5 * time.Minute
)

// inProcess keeps one Env per test binary: a second Start while one is in
// use fails at once (a shared libvirtd's machine-wide lock would otherwise
// wait on itself, and one libvirtd per binary is all a test needs). It
// guards a process-wide resource, which is why it is package state.
var inProcess sync.Mutex

// Env is a libvirtd a test can use.
type Env struct {
	socket string
	owned  bool   // started by Start: Restart and Stop are allowed
	dir    string // private directory: config, socket, pid files, logs

	ns *namespace // the private mount namespace (owned Envs)

	// hostname and hostUUID make the Env a host of its own for libvirt
	// (StartPair); empty for Start's.
	hostname, hostUUID string

	mu       sync.Mutex
	libvirtd *proc
	virtlogd *proc
}

// proc is a daemon child process and the channel closed when it exits.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // set before done is closed
}

// Start returns a libvirtd for the test. It fails or skips the test when none
// can be had. Only one Env may be in use in a process at a time.
func Start(t testing.TB) *Env {
	t.Helper()
	if !inProcess.TryLock() {
		t.Fatal("libvirtd.Start: another Env is in use in this test binary; pass it down instead of starting a second one")
	}
	t.Cleanup(inProcess.Unlock)
	if why := cannotStart(); why != "" {
		if !answers(DefaultSocket) {
			skip(t, why)
		}
		lock := acquireLock(t)
		t.Cleanup(func() { lock.Close() })
		t.Logf("using the libvirtd already answering on %s (%s)", DefaultSocket, why)
		e := &Env{socket: DefaultSocket}
		e.sweepStale(t)
		return e
	}
	return startOwned(t, "", "")
}

// startOwned starts virtlogd and libvirtd in a private namespace. A
// non-empty host gives them a UTS namespace with that hostname and
// libvirtd the host_uuid hostUUID, so that libvirt takes it for a host of
// its own (pair.go).
func startOwned(t testing.TB, host, hostUUID string) *Env {
	t.Helper()
	dir, err := os.MkdirTemp("", "vgpud-libvirtd-")
	if err != nil {
		t.Fatalf("libvirtd: temp dir: %v", err)
	}
	// Clients outside the namespace (virsh as another user in some tests)
	// reach the socket through it.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatalf("libvirtd: %v", err)
	}
	e := &Env{socket: filepath.Join(dir, "libvirt-sock"), owned: true, dir: dir, hostname: host, hostUUID: hostUUID}
	t.Cleanup(func() {
		e.stopAll(t)
		if t.Failed() {
			e.dumpLogs(t)
			if os.Getenv(debugEnv) != "" {
				t.Logf("libvirtd debug logs kept in %s", dir)
				return
			}
		}
		os.RemoveAll(dir)
	})
	if err := e.writeConfig(); err != nil {
		t.Fatalf("libvirtd: %v", err)
	}
	ns, err := newNamespace(dir, host)
	if err != nil {
		t.Fatalf("libvirtd: %v", err)
	}
	e.ns = ns
	e.virtlogd = e.spawn(t, "virtlogd", "-p", "/run/libvirt/virtlogd.pid")
	e.waitFor(t, e.virtlogd, func() bool { return dials(e.ns.path("/run/libvirt/virtlogd-sock")) })
	e.StartDaemon(t)
	return e
}

// cannotStart says why this process cannot start a libvirtd of its own
// ("" when it can).
func cannotStart() string {
	for _, bin := range []string{"libvirtd", "virtlogd", "qemu-system-x86_64", "unshare", "nsenter"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Sprintf("%s is not installed (apt-get install libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86 util-linux)", bin)
		}
	}
	if os.Geteuid() != 0 {
		return "no libvirtd answers on " + DefaultSocket + " and starting one needs root"
	}
	return ""
}

// writeConfig writes libvirtd's configuration in the Env's directory and
// the QEMU driver's in the private /etc/libvirt.
func (e *Env) writeConfig() error {
	conf := fmt.Sprintf("unix_sock_dir = %q\nunix_sock_rw_perms = \"0700\"\nauth_unix_rw = \"none\"\nauth_unix_ro = \"none\"\n", e.dir)
	if e.hostUUID != "" {
		// libvirt refuses a migration whose two ends report the same
		// host UUID (by default the machine's SMBIOS or /etc/machine-id,
		// shared by every libvirtd on one machine).
		conf += fmt.Sprintf("host_uuid = %q\n", e.hostUUID)
	}
	if f := os.Getenv(debugEnv); f != "" {
		// libvirtd's own log filter syntax, e.g. "1:qemu 3:*".
		conf += fmt.Sprintf("log_filters = %q\nlog_outputs = %q\n", f, "1:stderr")
	}
	if err := os.WriteFile(filepath.Join(e.dir, "libvirtd.conf"), []byte(conf), 0o600); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	etc := filepath.Join(e.dir, privateDir("/etc/libvirt"))
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return err
	}
	// Without it the QEMU driver runs guests as libvirt-qemu, which cannot
	// open what a root test prepares.
	qemu := "# Written by vgpud's test harness: TCG guests run as root here.\nuser = \"root\"\ngroup = \"root\"\n"
	if err := os.WriteFile(filepath.Join(etc, "qemu.conf"), []byte(qemu), 0o644); err != nil {
		return fmt.Errorf("write qemu.conf: %w", err)
	}
	return nil
}

// Socket is the path of libvirtd's read-write unix socket.
func (e *Env) Socket() string { return e.socket }

// URI is the connection URI for clients that take one (virsh -c): it names
// the socket when it is not the default one.
func (e *Env) URI() string {
	if e.socket == DefaultSocket {
		return "qemu:///system"
	}
	return "qemu:///system?socket=" + e.socket
}

// Owned reports whether this Env started libvirtd, so that it may stop and
// restart it.
func (e *Env) Owned() bool { return e.owned }

// Restart stops libvirtd and starts it again, as a package upgrade or a crash
// and restart would. Running guests keep running; the new libvirtd reattaches
// to them. It skips the test when the libvirtd was not started by Start.
func (e *Env) Restart(t testing.TB) {
	t.Helper()
	e.StopDaemon(t)
	e.StartDaemon(t)
}

// StopDaemon stops libvirtd (SIGTERM, then SIGKILL after 20 s) and waits for
// it to exit. It skips the test when the libvirtd was not started by Start.
func (e *Env) StopDaemon(t testing.TB) {
	t.Helper()
	e.requireOwned(t)
	e.mu.Lock()
	p := e.libvirtd
	e.libvirtd = nil
	e.mu.Unlock()
	if p == nil {
		return
	}
	if err := p.stop(); err != nil {
		t.Fatalf("libvirtd: stop: %v", err)
	}
}

// Pause stops libvirtd with SIGSTOP, as a hung libvirtd: its socket still
// accepts connections and nothing answers. The returned func (also run at
// cleanup) resumes it. It skips the test when the libvirtd was not started
// by Start.
func (e *Env) Pause(t testing.TB) (resume func()) {
	t.Helper()
	e.requireOwned(t)
	e.mu.Lock()
	p := e.libvirtd
	e.mu.Unlock()
	if p == nil {
		t.Fatal("libvirtd: Pause while it is stopped")
	}
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("libvirtd: pause: %v", err)
	}
	var once sync.Once
	resume = func() { once.Do(func() { p.cmd.Process.Signal(syscall.SIGCONT) }) }
	t.Cleanup(resume)
	return resume
}

// Revive starts libvirtd again if it exited on its own, and reports
// whether it had to; the exit and the log's tail are logged. libvirtd 9.0
// (Debian 12) segfaults now and then while tearing down the event
// callbacks of a client that was killed while it registered them (its log
// says "unexpected incomplete domain callback", the kernel's "segfault in
// libvirtd" in a prio-rpc thread), which a test that kills vgpud hundreds
// of times meets: vgpud reconnects to the new libvirtd as it would on a
// real host, where systemd restarts libvirtd.
func (e *Env) Revive(t testing.TB) bool {
	t.Helper()
	if !e.Exited(0) {
		return false
	}
	e.mu.Lock()
	p := e.libvirtd
	e.libvirtd = nil
	e.mu.Unlock()
	t.Logf("libvirtd exited on its own (%v); starting it again; log:\n%s", p.err, tail(p.log))
	e.StartDaemon(t)
	return true
}

// Exited reports whether the libvirtd this Env started has exited on its
// own, waiting up to wait for an exit under way: a crash comes a moment
// after the client whose teardown set it off went away.
func (e *Env) Exited(wait time.Duration) bool {
	e.mu.Lock()
	p := e.libvirtd
	e.mu.Unlock()
	if !e.owned || p == nil {
		return false
	}
	select {
	case <-p.done:
		return true
	default:
	}
	if wait <= 0 {
		return false
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-p.done:
		return true
	case <-timer.C:
		return false
	}
}

// Crash sends libvirtd SIGSEGV, as libvirtd 9.0 crashes (Revive), and
// returns without waiting for it to exit.
func (e *Env) Crash(t testing.TB) {
	t.Helper()
	e.requireOwned(t)
	e.mu.Lock()
	p := e.libvirtd
	e.mu.Unlock()
	if p == nil {
		t.Fatal("libvirtd: Crash while it is stopped")
	}
	if err := p.cmd.Process.Signal(syscall.SIGSEGV); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("libvirtd: crash: %v", err)
	}
}

// StartDaemon starts libvirtd (after StopDaemon, or the first time) and waits
// until it answers RPCs on the socket.
func (e *Env) StartDaemon(t testing.TB) {
	t.Helper()
	e.requireOwned(t)
	e.mu.Lock()
	running := e.libvirtd != nil
	e.mu.Unlock()
	if running {
		t.Fatal("libvirtd: StartDaemon while it is running")
	}
	p := e.spawn(t, "libvirtd", "-f", filepath.Join(e.dir, "libvirtd.conf"), "-p", "/run/libvirt/libvirtd.pid")
	e.mu.Lock()
	e.libvirtd = p
	e.mu.Unlock()
	e.waitFor(t, p, func() bool { return answers(e.socket) })
}

func (e *Env) requireOwned(t testing.TB) {
	t.Helper()
	if !e.owned {
		t.Skipf("libvirtd at %s was not started by this test; it cannot be stopped or restarted", e.socket)
	}
}

// spawn starts a daemon with its output in a log file in the private dir.
func (e *Env) spawn(t testing.TB, name string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(e.dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatalf("libvirtd: %v", err)
	}
	cmd := e.ns.command(name, args...)
	cmd.Stdout = f
	cmd.Stderr = f
	// If the test binary dies without running its cleanups, the daemons go
	// with it instead of holding the machine's only libvirtd slot.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("libvirtd: start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Logf("started %s (pid %d), log %s", name, cmd.Process.Pid, logPath)
	return p
}

// waitFor polls ready until it holds, failing early if p exits.
func (e *Env) waitFor(t testing.TB, p *proc, ready func() bool) {
	t.Helper()
	deadline := time.Now().Add(readyTimeout)
	for !ready() {
		select {
		case <-p.done:
			t.Fatalf("libvirtd: %s exited during start-up (%v); log:\n%s", p.name, p.err, tail(p.log))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("libvirtd: %s did not answer within %v; log:\n%s", p.name, readyTimeout, tail(p.log))
		}
	}
}

func (p *proc) stop() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %s: %w", p.name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
	}
	p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s ignored SIGTERM for %v and was killed", p.name, stopTimeout)
}

func (e *Env) stopAll(t testing.TB) {
	e.mu.Lock()
	lv, vl := e.libvirtd, e.virtlogd
	e.libvirtd, e.virtlogd = nil, nil
	e.mu.Unlock()
	for _, p := range []*proc{lv, vl} {
		if p == nil {
			continue
		}
		if err := p.stop(); err != nil {
			t.Errorf("libvirtd: %v", err)
		}
	}
	if e.ns != nil {
		e.ns.close()
	}
}

func (e *Env) dumpLogs(t testing.TB) {
	for _, name := range []string{"libvirtd", "virtlogd"} {
		p := filepath.Join(e.dir, name+".log")
		if _, err := os.Stat(p); err == nil {
			t.Logf("%s log (tail):\n%s", name, tail(p))
		}
	}
}

// Client opens a raw go-libvirt connection to the Env's libvirtd, closed at
// cleanup. Tests use it to arrange state that pkg/virt does not offer.
func (e *Env) Client(t testing.TB) *libvirt.Libvirt {
	t.Helper()
	l, err := dial(e.socket)
	if err != nil {
		t.Fatalf("libvirtd: connect to %s: %v", e.socket, err)
	}
	t.Cleanup(func() { l.Disconnect() })
	return l
}

// Virsh runs virsh against the Env's libvirtd and returns its output; a
// non-zero exit fails the test.
func (e *Env) Virsh(t testing.TB, args ...string) string {
	t.Helper()
	out, err := e.VirshErr(args...)
	if err != nil {
		t.Fatalf("virsh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// VirshErr runs virsh against the Env's libvirtd and returns its combined
// output and exit error.
func (e *Env) VirshErr(args ...string) (string, error) {
	cmd := exec.Command("virsh", append([]string{"-q", "-c", e.URI()}, args...)...)
	var buf bytes.Buffer
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	err := cmd.Run()
	return buf.String(), err
}

func dial(socket string) (*libvirt.Libvirt, error) {
	l := libvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(socket), dialers.WithLocalTimeout(2*time.Second)))
	done := make(chan error, 1)
	go func() { done <- l.ConnectToURI(libvirt.QEMUSystem) }()
	select {
	case err := <-done:
		return l, err
	case <-time.After(10 * time.Second):
		return nil, fmt.Errorf("no answer from %s within 10s", socket)
	}
}

// answers reports whether libvirtd answers a version RPC on socket.
func answers(socket string) bool {
	if _, err := os.Stat(socket); err != nil {
		return false
	}
	l, err := dial(socket)
	if err != nil {
		return false
	}
	defer l.Disconnect()
	_, err = l.ConnectGetLibVersion()
	return err == nil
}

// dials reports whether something accepts connections on a unix socket.
func dials(socket string) bool {
	c, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// acquireLock takes the machine-wide harness lock, waiting up to lockTimeout
// for another test binary to finish with libvirtd.
func acquireLock(t testing.TB) *os.File {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(lockPath), 0o1777); err != nil {
		t.Fatalf("libvirtd: %v", err)
	}
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		skip(t, fmt.Sprintf("cannot open %s: %v", lockPath, err))
	}
	deadline := time.Now().Add(lockTimeout)
	logged := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			t.Fatalf("libvirtd: lock %s: %v", lockPath, err)
		}
		if !logged {
			t.Logf("waiting for %s: another test binary is using libvirtd", lockPath)
			logged = true
		}
		if time.Now().After(deadline) {
			f.Close()
			t.Fatalf("libvirtd: %s still held after %v", lockPath, lockTimeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func skip(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv(requireEnv) == "1" {
		t.Fatalf("libvirtd test environment unavailable (%s=1): %s", requireEnv, reason)
	}
	t.Skipf("skipping: %s", reason)
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}
