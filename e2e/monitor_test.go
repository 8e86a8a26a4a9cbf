package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"strings"
	"testing"
	"time"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
)

// The private bus of the tests and the demo lets root watch it with
// `busctl monitor`, as the demo says; anyone else, even in group vgpud, is
// refused (dbus-daemon allows BecomeMonitor only to root and its own user).
func TestBusMonitorByRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	g, err := user.LookupGroup("vgpud")
	if err != nil {
		t.Skipf("no group vgpud (scripts/install-deps.sh creates it): %v", err)
	}
	if _, err := exec.LookPath("busctl"); err != nil {
		t.Skipf("no busctl: %v", err)
	}
	bus := testbus.Start(t)
	// monitor runs busctl monitor with setpriv's args ("" none: as root)
	// and says whether it was still watching when the deadline ended it.
	monitor := func(setpriv ...string) (string, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		argv := append(append([]string{"setpriv"}, setpriv...), "busctl", "--address="+bus.Address(), "monitor")
		if len(setpriv) == 0 {
			argv = argv[1:]
		}
		out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
		return string(out), err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded)
	}
	if out, watching := monitor(); !watching {
		t.Errorf("root cannot monitor the bus:\n%s", out)
	}
	for _, who := range [][]string{
		{"--reuid=65534", "--regid=65534", "--groups=" + g.Gid},
		{"--reuid=65534", "--regid=65534", "--clear-groups"},
	} {
		if out, watching := monitor(who...); watching || !strings.Contains(strings.ToLower(out), "denied") {
			t.Errorf("%v may monitor the bus (watching %v):\n%s", who, watching, out)
		}
	}
}
