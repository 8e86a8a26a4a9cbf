package sim

import (
	"testing"

	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

// openDefault opens the built-in host in a fresh directory for a test of
// the package's internals; it is closed when the test ends.
func openDefault(t *testing.T) *Host {
	t.Helper()
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	h, err := Open(t.TempDir(), nil, cat, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}
