// Package container holds vgpud's container tests: the Debian package
// (scripts/package-deb.sh) installed, as an operator installs it, into a
// Debian 12 root booted with systemd as PID 1 (systemd-nspawn), with the
// container's own system bus, logind and polkitd. Only the NVIDIA driver is
// simulated: a drop-in adds --sim, so the simulated host lives under the
// unit's StateDirectory. Each check is its own test; TestMain boots the
// container once.
//
// The tests need root, debootstrap, systemd-nspawn, nsenter and dpkg-deb;
// the web console's login test (TestCockpitLogin) also chromium, on the
// host, reaching the container's Cockpit through a forwarded port.
// Without them they skip, unless VGPUD_TEST_REQUIRE_SERVICES is set (CI
// sets it), when that is a failure. The Debian root is built once per
// machine (scripts/container-root.sh caches it) and booted through an
// overlay, so the cached root is never changed. While the container runs
// the tests hold /tmp/vgpud-e2e.lock, which every e2e run on a shared
// machine takes.
package container

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// ct is the booted container every test drives.
var ct *container

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	flag.Parse()
	if why := missing(); why != "" {
		if os.Getenv("VGPUD_TEST_REQUIRE_SERVICES") != "" {
			fmt.Fprintf(os.Stderr, "container tests: %s (VGPUD_TEST_REQUIRE_SERVICES is set: a failure, not a skip)\n", why)
			return 1
		}
		fmt.Printf("container tests: skipped: %s\n", why)
		return 0
	}
	// systemd-nspawn gets PDEATHSIG, which is bound to the thread that
	// started it: this goroutine keeps its thread until the process ends,
	// so a test binary killed by -timeout takes the container with it.
	runtime.LockOSThread()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := boot(ctx)
	if c != nil {
		defer c.close()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "container tests: boot:", err)
		return 1
	}
	fmt.Printf("container tests: container up, vgpud installed in %s\n", time.Since(start).Round(time.Second))
	ct = c
	code := m.Run()
	if code != 0 {
		c.dumpJournal()
	}
	return code
}

// missing says what the tests need and this machine lacks, or "".
func missing() string {
	if os.Geteuid() != 0 {
		return "not root (systemd-nspawn and debootstrap need it)"
	}
	for _, tool := range []string{"debootstrap", "systemd-nspawn", "nsenter", "dpkg-deb", "flock"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " not found (scripts/install-deps.sh installs it)"
		}
	}
	return ""
}

// lockE2E takes the machine-wide e2e lock, waiting for whoever holds it.
// The wait blocks in the kernel, as flock(1)'s does, so the lock goes to
// waiters in turn and a poller is not starved.
func lockE2E(ctx context.Context) (*os.File, error) {
	f, err := os.OpenFile("/tmp/vgpud-e2e.lock", os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, err
	}
	got := make(chan error, 1)
	go func() { got <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
	select {
	case err := <-got:
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("flock /tmp/vgpud-e2e.lock: %w", err)
		}
		return f, nil
	case <-ctx.Done():
		// The blocked flock goes with the process, which is about to end.
		return nil, fmt.Errorf("waiting for /tmp/vgpud-e2e.lock: %w", ctx.Err())
	}
}
