package libvirtd

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
)

// TestPrivateBesideSystemLibvirtd: with a system libvirtd running as an
// operator's does (default configuration and paths, holding
// /run/libvirt/network/driver.pid), the harness's libvirtd still starts,
// runs a guest and restarts, and neither sees the other's domains.
func TestPrivateBesideSystemLibvirtd(t *testing.T) {
	if why := cannotStart(); why != "" {
		skip(t, why)
	}
	sys := systemLibvirtd(t)
	e := Start(t)
	if e.Socket() == DefaultSocket {
		t.Fatalf("Start used the system libvirtd at %s instead of its own", DefaultSocket)
	}
	d := e.DefineDomain(t, "testenv-beside-system")
	e.StartDomain(t, d.Name)
	if _, err := sys.DomainLookupByName(d.Name); !libvirt.IsNotFound(err) {
		t.Fatalf("the system libvirtd sees the harness's domain (err %v)", err)
	}
	e.Restart(t)
	if got := strings.TrimSpace(e.Virsh(t, "domstate", d.Name)); got != "running" {
		t.Fatalf("after restart domstate = %q, want running", got)
	}
	if _, err := sys.ConnectGetLibVersion(); err != nil {
		t.Fatalf("the system libvirtd stopped answering beside the harness's: %v", err)
	}
	if _, err := os.Stat("/etc/libvirt/qemu/" + d.Name + ".xml"); err == nil {
		t.Fatalf("the harness's domain was written to the system's /etc/libvirt/qemu")
	}
}

// systemLibvirtd returns a connection to the system libvirtd on the
// default socket, starting one (virtlogd and libvirtd with no arguments, as
// an operator's service runs them) when none answers, stopped at cleanup.
// The harness's machine-wide lock is held meanwhile, so no other test
// binary takes the started one for a libvirtd of its own to use.
func systemLibvirtd(t *testing.T) *libvirt.Libvirt {
	t.Helper()
	lock := acquireLock(t)
	t.Cleanup(func() { lock.Close() })
	if answers(DefaultSocket) {
		t.Logf("a system libvirtd already answers on %s", DefaultSocket)
	} else {
		if !dials("/run/libvirt/virtlogd-sock") {
			startSystem(t, "virtlogd")
		}
		p := startSystem(t, "libvirtd")
		deadline := time.Now().Add(readyTimeout)
		for !answers(DefaultSocket) {
			select {
			case <-p.done:
				t.Fatalf("the system libvirtd exited at start-up (%v):\n%s", p.err, tail(p.log))
			case <-time.After(100 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("the system libvirtd did not answer within %v:\n%s", readyTimeout, tail(p.log))
			}
		}
	}
	l, err := dial(DefaultSocket)
	if err != nil {
		t.Fatalf("connect to the system libvirtd: %v", err)
	}
	t.Cleanup(func() { l.Disconnect() })
	if _, err := os.Stat("/run/libvirt/network/driver.pid"); err != nil {
		t.Logf("the system libvirtd holds no network driver pid file (%v); the check is weaker", err)
	}
	return l
}

// startSystem runs a system daemon with default paths, stopped at cleanup
// (registered before the harness's, so it runs after them).
func startSystem(t *testing.T, name string) *proc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start system %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		if err := p.stop(); err != nil {
			t.Errorf("system %s: %v", name, err)
		}
	})
	t.Logf("started a system %s (pid %d)", name, cmd.Process.Pid)
	return p
}
