package sim_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// TestSharersSeeEveryCommittedWrite checks that a host opened by one
// process sees each write another process commits, however fast they
// come, and never writes back an older state over it. Two Hosts on one
// directory stand for the two processes (each has its own open lock file,
// so their file locks exclude each other as processes' do).
//
// Each round the writer makes two writes that leave state.json the size it
// had (a fault added and removed again). On ext4 the second temp file gets
// back the inode of the version before the first, and a kernel without
// fine-grained file times gives writes within one clock tick the same
// mtime; the test sets every version's mtime to one instant, as such a
// kernel does for quick writes. A host that told versions apart by inode,
// size and mtime then took the old state for current. The test runs with
// the token each write leaves in an extended attribute, and without it, as
// on a filesystem that keeps none.
func TestSharersSeeEveryCommittedWrite(t *testing.T) {
	for _, keepAttrs := range []bool{true, false} {
		t.Run(fmt.Sprintf("xattrs=%v", keepAttrs), func(t *testing.T) {
			sharers(t, keepAttrs)
		})
	}
}

func sharers(t *testing.T, keepAttrs bool) {
	cat := catalog(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "state.json")
	tick := time.Now().Truncate(time.Second)
	// oneTick makes the version just written look like the others.
	oneTick := func() {
		t.Helper()
		if err := os.Chtimes(state, tick, tick); err != nil {
			t.Fatal(err)
		}
		if keepAttrs {
			return
		}
		if err := unix.Removexattr(state, "user.vgpud-sim.version"); err != nil && !errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.ENOTSUP) {
			t.Fatal(err)
		}
	}
	w, err := sim.Open(dir, nil, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	r, err := sim.Open(dir, nil, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	oneTick()
	generation := func(h *sim.Host) uint64 {
		t.Helper()
		g, err := h.Generation()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	for i := 0; i < 20; i++ {
		generation(r) // r holds the version committed now
		if err := w.AddFault(sim.Fault{Op: "write:none"}); err != nil {
			t.Fatal(err)
		}
		oneTick()
		if err := w.ClearFaults(); err != nil {
			t.Fatal(err)
		}
		oneTick()
		want := generation(w)
		if i%2 == 0 {
			if got := generation(r); got != want {
				t.Fatalf("round %d: the reader sees generation %d; the writer committed %d", i, got, want)
			}
			continue
		}
		// A write by r goes on top of what w committed.
		if err := r.SetDriverLoaded(true); err != nil {
			t.Fatal(err)
		}
		oneTick()
		if got := generation(w); got != want+1 {
			t.Fatalf("round %d: after the other host's write the state has generation %d, want %d (written over an older state)", i, got, want+1)
		}
	}
}

// TestFailedWriteIsNotKept checks that a change whose state.json could not
// be written is seen by no one afterwards, the process that made it
// included, and is not committed by that process's next write.
func TestFailedWriteIsNotKept(t *testing.T) {
	cat := catalog(t)
	dir := t.TempDir()
	h, err := sim.Open(dir, nil, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	before, err := h.Summary()
	if err != nil {
		t.Fatal(err)
	}
	// A directory where the temp file goes makes the write fail.
	tmp := filepath.Join(dir, "state.json.tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := h.LoseGPU(sim.DefaultL4); err == nil {
		t.Fatal("LoseGPU succeeded without writing state.json")
	}
	if got, err := h.Summary(); err != nil || got != before {
		t.Fatalf("after a failed write the host shows (err %v)\n%s\nwant\n%s", err, got, before)
	}
	if err := os.Remove(tmp); err != nil {
		t.Fatal(err)
	}
	if err := h.SetDriverLoaded(true); err != nil {
		t.Fatal(err)
	}
	other, err := sim.Open(dir, nil, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	if got, err := other.Summary(); err != nil || got != before {
		t.Fatalf("the next write committed the failed change (err %v):\n%s\nwant\n%s", err, got, before)
	}
}
