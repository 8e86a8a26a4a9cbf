package sim

import (
	"testing"

	"golang.org/x/sys/unix"
)

// The check readers make without the file lock finds each version by its
// token, and where the filesystem keeps none, by the generation at the
// head of state.json; if that could not be read (a field moved ahead of it
// in state), every read would take the lock and parse the whole file:
// correct, but slow.
func TestCommittedStamp(t *testing.T) {
	h := openDefault(t)
	for i := 0; i < 12; i++ {
		if err := h.SetDriverLoaded(true); err != nil {
			t.Fatal(err)
		}
		s, err := h.committed()
		if err != nil {
			t.Fatal(err)
		}
		if !s.same(h.stamp) {
			t.Fatalf("stamp of the file %+v; the host wrote %+v", s, h.stamp)
		}
		if s.token == "" {
			t.Logf("no extended attributes here: versions told apart by generation")
			continue
		}
		// Without the attribute (a filesystem that keeps none, a copied
		// file) the head tells the version.
		if err := unix.Removexattr(h.statePath(), versionAttr); err != nil {
			t.Fatal(err)
		}
		s, err = h.committed()
		if err != nil {
			t.Fatal(err)
		}
		if s.token != "" || s.generation != h.st.Generation {
			t.Fatalf("stamp of the file without its token %+v; the host wrote generation %d", s, h.st.Generation)
		}
	}
	for _, c := range []struct {
		head string
		gen  uint64
		ok   bool
	}{
		{`{"version":1,"generation":42,"boot":1`, 42, true},
		{`{"version":1,"generation":18446744073709551615}`, 1<<64 - 1, true},
		{`{"version":1,"generation":4`, 0, false}, // cut: 4, 42 or 420...
		{`{"version":1,"boot":1,"generation":4,`, 0, false},
		{`{"generation":4,"version":1,`, 0, false},
		{``, 0, false},
	} {
		if g, ok := headGeneration([]byte(c.head)); g != c.gen || ok != c.ok {
			t.Errorf("headGeneration(%s) = %d, %v; want %d, %v", c.head, g, ok, c.gen, c.ok)
		}
	}
}
