// Package dbus gives tests a private D-Bus system bus: a dbus-daemon child
// process with its own configuration, modelled on Debian's
// /usr/share/dbus-1/system.conf (method calls denied by default, the bus
// driver open to all), that includes the project's shipped policy file
// systemd/dbus-1/dev.vgpud1.conf, so tests exercise the policy that is
// installed on hosts. The socket lives in a temporary directory with mode
// 0755, so a caller run as another uid (setpriv --reuid=65534) reaches it.
// The daemon is stopped and the directory removed at cleanup.
//
// Only tests import it (pkg/dbusapi's tests and the e2e suite).
//
// Tests skip, with the reason printed, when dbus-daemon is not installed;
// VGPUD_TEST_REQUIRE_DBUS=1 turns that skip into a failure, for CI machines
// that install the packages.
//
// Imports: internal/testenv.
package dbus

import (
	"bufio"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
)

const (
	requireEnv   = "VGPUD_TEST_REQUIRE_DBUS"
	readyTimeout = 20 * time.Second
	stopTimeout  = 10 * time.Second
	// PolicyPath is the shipped policy file, relative to the repository root.
	PolicyPath = "systemd/dbus-1/dev.vgpud1.conf"
)

// Bus is a running private system bus.
type Bus struct {
	dir     string
	socket  string
	address string
	cmd     *exec.Cmd
	done    chan struct{}
	log     string
}

// Options change the bus configuration.
type Options struct {
	// Policy is the policy file to include; "" is the shipped one.
	Policy string
	// Extra is more <busconfig> content (policies), e.g. to let a test own
	// a fake org.freedesktop.PolicyKit1.
	Extra string
}

// Start runs a private system bus for the test with the shipped policy.
func Start(t testing.TB) *Bus { return StartWith(t, Options{}) }

// StartWith runs a private system bus with opts.
func StartWith(t testing.TB, opts Options) *Bus {
	t.Helper()
	bin, err := exec.LookPath("dbus-daemon")
	if err != nil {
		skip(t, "dbus-daemon is not installed (apt-get install dbus-daemon)")
	}
	policy := opts.Policy
	if policy == "" {
		root, err := RepoRoot()
		if err != nil {
			t.Fatalf("dbus: %v", err)
		}
		policy = filepath.Join(root, PolicyPath)
	}
	if _, err := os.Stat(policy); err != nil {
		t.Fatalf("dbus: policy file: %v", err)
	}
	dir, err := os.MkdirTemp("", "vgpud-dbus-")
	if err != nil {
		t.Fatalf("dbus: temp dir: %v", err)
	}
	// MkdirTemp makes it 0700; callers running as another uid must reach
	// the socket inside.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatalf("dbus: %v", err)
	}
	b := &Bus{dir: dir, socket: filepath.Join(dir, "system_bus_socket"), done: make(chan struct{}), log: filepath.Join(dir, "dbus-daemon.log")}
	extra := ""
	if opts.Extra != "" {
		extraPath := filepath.Join(dir, "extra.conf")
		doc := busconfigHeader + "<busconfig>\n" + opts.Extra + "\n</busconfig>\n"
		if err := os.WriteFile(extraPath, []byte(doc), 0o644); err != nil {
			t.Fatalf("dbus: %v", err)
		}
		extra = fmt.Sprintf("  <include>%s</include>\n", extraPath)
	}
	conf := filepath.Join(dir, "system.conf")
	if err := os.WriteFile(conf, []byte(config(b.socket, policy, extra)), 0o644); err != nil {
		t.Fatalf("dbus: write config: %v", err)
	}
	logf, err := os.Create(b.log)
	if err != nil {
		t.Fatalf("dbus: %v", err)
	}
	cmd := exec.Command(bin, "--config-file="+conf, "--nofork", "--nopidfile", "--print-address")
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("dbus: %v", err)
	}
	// If the test binary dies without its cleanups, the bus goes with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("dbus: start dbus-daemon: %v", err)
	}
	b.cmd = cmd
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			addr <- strings.TrimSpace(sc.Text())
		}
		close(addr)
		for sc.Scan() {
		}
	}()
	go func() {
		cmd.Wait()
		logf.Close()
		close(b.done)
	}()
	t.Cleanup(func() {
		b.stop(t)
		if t.Failed() {
			if out, err := os.ReadFile(b.log); err == nil && len(out) > 0 {
				t.Logf("dbus-daemon log:\n%s", out)
			}
		}
		os.RemoveAll(dir)
	})
	select {
	case a, ok := <-addr:
		if !ok || a == "" {
			<-b.done
			out, _ := os.ReadFile(b.log)
			t.Fatalf("dbus: dbus-daemon exited before printing its address:\n%s", out)
		}
		b.address = a
	case <-time.After(readyTimeout):
		t.Fatalf("dbus: dbus-daemon did not print its address within %v", readyTimeout)
	}
	t.Logf("private system bus at %s (pid %d)", b.address, cmd.Process.Pid)
	return b
}

// Address is the bus address (unix:path=...,guid=...), for
// DBUS_SYSTEM_BUS_ADDRESS, busctl --address and vgpuctl --connect.
func (b *Bus) Address() string { return b.address }

// Socket is the path of the bus socket.
func (b *Bus) Socket() string { return b.socket }

// Env is os.Environ() with DBUS_SYSTEM_BUS_ADDRESS pointing at the bus.
func (b *Bus) Env() []string {
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DBUS_SYSTEM_BUS_ADDRESS=") {
			env = append(env, kv)
		}
	}
	return append(env, "DBUS_SYSTEM_BUS_ADDRESS="+b.address)
}

// Log returns what dbus-daemon wrote to stderr so far.
func (b *Bus) Log() string {
	out, _ := os.ReadFile(b.log)
	return string(out)
}

func (b *Bus) stop(t testing.TB) {
	select {
	case <-b.done:
		return
	default:
	}
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("dbus: signal dbus-daemon: %v", err)
	}
	select {
	case <-b.done:
	case <-time.After(stopTimeout):
		b.cmd.Process.Kill()
		<-b.done
		t.Errorf("dbus: dbus-daemon ignored SIGTERM for %v and was killed", stopTimeout)
	}
}

// RepoRoot finds the repository root (the directory holding go.mod).
func RepoRoot() (string, error) { return testenv.RepoRoot() }

const busconfigHeader = `<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
`

// busConf is the configuration of every private bus, shared with
// scripts/demo.sh, which fills in the same placeholders.
//
//go:embed bus.conf.in
var busConf string

// config is the bus configuration: Debian's system bus defaults, a private
// socket, and the policy under test.
func config(socket, policy, extra string) string {
	return strings.NewReplacer("@SOCKET@", socket, "@POLICY@", policy, "@EXTRA@", extra).Replace(busConf)
}

func skip(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv(requireEnv) == "1" {
		t.Fatalf("D-Bus test environment unavailable (%s=1): %s", requireEnv, reason)
	}
	t.Skipf("skipping: %s", reason)
}
