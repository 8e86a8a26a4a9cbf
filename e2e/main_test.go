// Package e2e holds vgpud's end-to-end tests: the built binaries and the
// manager against real services (dbus-daemon, libvirtd with QEMU), on the
// simulated GPU host. Tests skip, printing why, only when a service binary
// is absent.
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/vgpud/vgpud/internal/testenv"
)

// Paths of the binaries TestMain built (or found in $VGPUD_E2E_BIN).
var (
	vgpudBin   string
	vgpuctlBin string
)

// TestMain builds bin/vgpud and bin/vgpuctl once for the whole run, into a
// directory of its own so concurrent runs do not replace each other's
// binaries. VGPUD_E2E_BIN=DIR uses binaries built already (make e2e builds
// bin/ first).
func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	if os.Getenv("VGPUD_E2E_NOBODY") != "" {
		// A copy of this binary run as another uid (dbus_test.go's
		// helper): it needs no binaries and could not build them.
		return m.Run()
	}
	dir := os.Getenv("VGPUD_E2E_BIN")
	if dir == "" {
		tmp, err := os.MkdirTemp("", "vgpud-e2e-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
		defer os.RemoveAll(tmp)
		// Callers run as other uids (setpriv) execute these binaries.
		if err := os.Chmod(tmp, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
		if err := build(tmp); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: build:", err)
			return 1
		}
		dir = tmp
	}
	vgpudBin, vgpuctlBin = filepath.Join(dir, "vgpud"), filepath.Join(dir, "vgpuctl")
	for _, b := range []string{vgpudBin, vgpuctlBin} {
		if _, err := os.Stat(b); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
	}
	return m.Run()
}

func build(dir string) error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	cmd := exec.Command(goBin, "build", "-o", dir+"/", "./cmd/vgpud", "./cmd/vgpuctl")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v\n%s", err, out)
	}
	return nil
}
