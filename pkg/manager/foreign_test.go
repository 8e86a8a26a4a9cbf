package manager_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
	"github.com/vgpud/vgpud/pkg/manager"
)

// An mdev mdevctl defines is reported as foreign with mdevctl as its
// origin, a transient one without; vgpud removes neither, and both count
// against the GPU's capacity.
func TestForeignMdevFromMdevctl(t *testing.T) {
	e := newEnv(t, nil)
	g, err := e.m.GPU(sim.DefaultA10)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.VGPU.MdevParents) < 2 {
		t.Fatalf("A10 mdev parents: %+v", g.VGPU.MdevParents)
	}
	md, _ := e.cat.Model("A10-24GB")
	vt, ok := md.VGPUTypeByName("A10-12Q")
	if !ok {
		t.Fatal("no A10-12Q in the catalog")
	}
	typ := vt.ID
	fs := sysfs.New(e.sim.FS())
	const defined, transient = "6f1d3b8c-0a52-4d6e-9b1a-3c2f5e7d9a01", "6f1d3b8c-0a52-4d6e-9b1a-3c2f5e7d9a02"
	for i, u := range []string{defined, transient} {
		if err := fs.CreateMdev(g.VGPU.MdevParents[i].PCI, typ, u); err != nil {
			t.Fatalf("create mdev %s: %v", u, err)
		}
	}
	if err := e.sim.MdevctlDefine(g.VGPU.MdevParents[0].PCI, defined, "nvidia-"+strconv.Itoa(typ), "auto"); err != nil {
		t.Fatal(err)
	}
	rep, err := e.m.Reconcile(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	origins := map[string]manager.Foreign{}
	for _, f := range rep.Foreign {
		origins[f.ID] = f
	}
	if f := origins[defined]; f.Kind != manager.ForeignMdev || f.Origin != manager.OriginMdevctl || !strings.Contains(f.Detail, "defined by mdevctl (start auto)") {
		t.Errorf("mdevctl's mdev reported as %+v", f)
	}
	if f := origins[transient]; f.Kind != manager.ForeignMdev || f.Origin != "" || strings.Contains(f.Detail, "mdevctl") {
		t.Errorf("transient mdev reported as %+v", f)
	}
	for _, u := range []string{defined, transient} {
		if _, err := fs.Mdev(u); err != nil {
			t.Errorf("mdev %s after reconcile: %v", u, err)
		}
	}
	// The A10 holds two A10-12Q at most: the two foreign ones fill it.
	e.tenant("acme", unlimited())
	if _, err := e.create("acme", "A10-12Q", sim.DefaultA10); err == nil {
		t.Error("created an A10-12Q beside two foreign ones")
	}
}

// foreignMdev makes an mdev vgpud did not create, as mdevctl does (defined
// with start auto, then started): type A10-4Q on the A10's first mdev
// parent, or on parent when given.
func (e *env) foreignMdev(id, parent string) (parentPCI string, typeID int) {
	e.t.Helper()
	return e.foreignMdevOf(id, parent, "A10-4Q")
}

// foreignMdevOf is foreignMdev of A10 vGPU type typeName.
func (e *env) foreignMdevOf(id, parent, typeName string) (parentPCI string, typeID int) {
	e.t.Helper()
	g, err := e.m.GPU(sim.DefaultA10)
	if err != nil {
		e.t.Fatal(err)
	}
	if parent == "" {
		parent = g.VGPU.MdevParents[0].PCI
	}
	md, _ := e.cat.Model("A10-24GB")
	vt, ok := md.VGPUTypeByName(typeName)
	if !ok {
		e.t.Fatalf("no %s in the catalog", typeName)
	}
	if err := e.sim.MdevctlDefine(parent, id, "nvidia-"+strconv.Itoa(vt.ID), "auto"); err != nil {
		e.t.Fatal(err)
	}
	if err := sysfs.New(e.sim.FS()).CreateMdev(parent, vt.ID, id); err != nil {
		e.t.Fatal(err)
	}
	return parent, vt.ID
}

// mdevOn says where the host holds mdev id ("" when it does not).
func (e *env) mdevOn(id string) string {
	e.t.Helper()
	m, err := sysfs.New(e.sim.FS()).Mdev(id)
	if err != nil {
		return ""
	}
	return m.Parent
}

// TestCreateNeverAdoptsForeignMdev: a create whose UUID names another
// tool's mdev is refused, Conflict saying where the mdev is, every time
// and in any case of the UUID, whether vgpud's view of the host has seen
// the mdev yet or not; the mdev stays, reconcile keeps reporting it as
// mdevctl's, and a destroy by its UUID finds no instance. A create that
// retried with the same UUID used to take the mdev over (same UUID,
// parent and type counted as its own), and a later destroy removed it;
// the first, failed, attempt already removed it in its undo.
func TestCreateNeverAdoptsForeignMdev(t *testing.T) {
	const u = "6f1d3b8c-0a52-4d6e-9b1a-3c2f5e7d9a11"
	for _, refreshed := range []bool{false, true} {
		t.Run(fmt.Sprintf("refreshed=%v", refreshed), func(t *testing.T) {
			e := newEnv(t, nil)
			e.tenant("t", unlimited())
			parent, _ := e.foreignMdev(u, "")
			if refreshed {
				if err := e.m.Refresh(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			before := e.summary()
			for i, id := range []string{u, u, strings.ToUpper(u), u} {
				_, err := e.m.Create(context.Background(), manager.CreateRequest{Tenant: "t", Profile: "A10-4Q", UUID: id})
				if !errors.Is(err, manager.ErrConflict) || !strings.Contains(manager.Message(err), "on "+parent) {
					t.Fatalf("create %d with the foreign mdev's UUID %s: %v, want Conflict saying it is on %s", i, id, err, parent)
				}
				if got := e.mdevOn(u); got != parent {
					t.Fatalf("after create %d the foreign mdev is on %q, want %s", i, got, parent)
				}
				if _, err := e.m.Instance(u); !errors.Is(err, manager.ErrNotFound) {
					t.Fatalf("after create %d: instance %s: %v, want NotFound", i, u, err)
				}
			}
			if refreshed && !strings.Contains(manager.Message(func() error {
				_, err := e.m.Create(context.Background(), manager.CreateRequest{Tenant: "t", Profile: "A10-4Q", UUID: u})
				return err
			}()), "defined by mdevctl") {
				t.Error("the refusal does not say mdevctl defines the mdev")
			}
			if got := e.summary(); got != before {
				t.Fatalf("refused creates changed the host:\n%s\nwas\n%s", got, before)
			}
			assertForeignMdev(t, e, u, parent)
			if err := e.m.Destroy(context.Background(), strings.ToUpper(u), manager.DestroyOptions{}); !errors.Is(err, manager.ErrNotFound) {
				t.Fatalf("destroy %s: %v, want NotFound", u, err)
			}
			if got := e.mdevOn(u); got != parent {
				t.Fatalf("after destroy the foreign mdev is on %q, want %s", got, parent)
			}
		})
	}
}

// assertForeignMdev: reconcile reports mdev id on parent as foreign,
// mdevctl's, and leaves it.
func assertForeignMdev(t *testing.T, e *env, id, parent string) {
	t.Helper()
	rep, err := e.m.Reconcile(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range rep.Foreign {
		if f.ID == id {
			found = f.Kind == manager.ForeignMdev && f.Origin == manager.OriginMdevctl
		}
	}
	if !found {
		t.Fatalf("reconcile does not report mdev %s as mdevctl's: %+v", id, rep.Foreign)
	}
	if got := e.mdevOn(id); got != parent {
		t.Fatalf("after reconcile mdev %s is on %q, want %s", id, got, parent)
	}
}

// TestCreateRacingForeignMdev: an mdev with the instance's UUID that
// appears after the admission (another tool started it) is found by the
// create, which fails without taking it away, on the parent the create
// chose or another; a crash before the create's write leaves a record
// the next start undoes, and the mdev it finds there is not the
// record's: it stays, reported as foreign.
func TestCreateRacingForeignMdev(t *testing.T) {
	const u = "6f1d3b8c-0a52-4d6e-9b1a-3c2f5e7d9a12"
	for _, c := range []struct {
		name      string
		sameSlot  bool
		crash     bool
		wantError error
	}{
		{"same parent", true, false, manager.ErrConflict},
		{"other parent", false, false, manager.ErrConflict},
		{"crash, same parent", true, true, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, nil)
			e.tenant("t", unlimited())
			var parent string
			e.crash = func(p string) {
				if p != manager.CrashCreateIntent {
					return
				}
				recs, _ := e.m.AllInstances()
				if len(recs) != 1 {
					t.Errorf("records at the crash point: %+v", recs)
					return
				}
				g, _ := e.m.GPU(sim.DefaultA10)
				parent = recs[0].MdevParent
				if !c.sameSlot {
					for _, p := range g.VGPU.MdevParents {
						if p.PCI != recs[0].MdevParent {
							parent = p.PCI
							break
						}
					}
				}
				e.foreignMdev(u, parent)
				if c.crash {
					runtime.Goexit()
				}
			}
			var err error
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, err = e.m.Create(context.Background(), manager.CreateRequest{Tenant: "t", Profile: "A10-4Q", UUID: u})
			}()
			<-done
			if c.crash {
				rep := e.restart()
				if len(rep.Undone) != 1 || len(rep.Finished) != 0 {
					t.Fatalf("restart after the crash: %+v, want the create undone", rep)
				}
			} else if !errors.Is(err, c.wantError) || !strings.Contains(manager.Message(err), "exists on "+parent) {
				t.Fatalf("create: %v, want %v saying the mdev exists on %s", err, c.wantError, parent)
			}
			if _, err := e.m.Instance(u); !errors.Is(err, manager.ErrNotFound) {
				t.Fatalf("instance %s: %v, want NotFound", u, err)
			}
			assertForeignMdev(t, e, u, parent)
		})
	}
}

// plantHostileMdevctl puts into the simulated host's mdevctl directory,
// under parent, an entry named id of kind: "fifo", "dev-zero-link" (an
// endless file), "fifo-link", "char-device" (/dev/zero's numbers; false
// when this host may not make one), "directory" or "huge" (300 MB,
// sparse).
func plantHostileMdevctl(t testing.TB, dir, parent, id, kind string) bool {
	t.Helper()
	p := filepath.Join(dir, parent, id)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.RemoveAll(p)
	var err error
	switch kind {
	case "fifo":
		err = syscall.Mkfifo(p, 0o644)
	case "dev-zero-link":
		err = os.Symlink("/dev/zero", p)
	case "fifo-link":
		fifo := filepath.Join(dir, ".fifo-"+id)
		_ = os.Remove(fifo)
		if err = syscall.Mkfifo(fifo, 0o644); err == nil {
			err = os.Symlink(fifo, p)
		}
	case "char-device":
		if syscall.Mknod(p, syscall.S_IFCHR|0o644, 1<<8|5) != nil {
			return false
		}
	case "directory":
		err = os.Mkdir(p, 0o755)
	case "huge":
		var f *os.File
		if f, err = os.Create(p); err == nil {
			err = f.Truncate(300 << 20)
			f.Close()
		}
	default:
		t.Fatalf("no hostile mdevctl entry %q", kind)
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// hostileMdevctlKinds are plantHostileMdevctl's kinds.
var hostileMdevctlKinds = []string{"fifo", "dev-zero-link", "fifo-link", "char-device", "directory", "huge"}

// TestHostileMdevctlDirectory: whatever stands in mdevctl's directory
// under a definition's name (a FIFO, a link to /dev/zero or to a FIFO, a
// device node, a directory, a 300 MB file), reconcile and creates run as
// before: the entry is skipped, and named in the GPU's discovery errors
// and, for a foreign mdev it would define, in the foreign report. A FIFO
// used to hold every reconcile and create until something wrote to it;
// a link to /dev/zero ran the daemon out of memory at every start.
func TestHostileMdevctlDirectory(t *testing.T) {
	for _, kind := range hostileMdevctlKinds {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t, nil)
			e.tenant("t", unlimited())
			const u = "6f1d3b8c-0a52-4d6e-9b1a-3c2f5e7d9a13"
			parent, _ := e.foreignMdev(u, "")
			if !plantHostileMdevctl(t, e.sim.MdevctlDir(), parent, u, kind) {
				t.Skip("this host may not make device nodes")
			}
			plantHostileMdevctl(t, e.sim.MdevctlDir(), "0000:a1:01.7", "6f1d3b8c-0a52-4d6e-9b1a-3c2f5e7d9a14", kind)
			type result struct {
				rep manager.ReconcileReport
				err error
			}
			done := make(chan result, 1)
			go func() {
				rep, err := e.m.Reconcile(context.Background())
				if err == nil {
					_, err = e.m.Create(context.Background(), manager.CreateRequest{Tenant: "t", Profile: "A10-4Q"})
				}
				done <- result{rep, err}
			}()
			var r result
			select {
			case r = <-done:
			case <-time.After(time.Minute):
				t.Fatal("reconcile and create did not return with a hostile entry in mdevctl's directory")
			}
			if r.err != nil {
				t.Fatal(r.err)
			}
			var f manager.Foreign
			for _, x := range r.rep.Foreign {
				if x.ID == u {
					f = x
				}
			}
			if f.Kind != manager.ForeignMdev || f.Origin != "" || !strings.Contains(f.Detail, parent+"/"+u+" skipped") {
				t.Errorf("foreign report of the mdev whose definition is a hostile entry: %+v", f)
			}
			g, err := e.m.GPU(sim.DefaultA10)
			if err != nil {
				t.Fatal(err)
			}
			if errs := strings.Join(g.Errors, "\n"); !strings.Contains(errs, parent+"/"+u+" skipped") {
				t.Errorf("GPU errors do not name the skipped entry: %q", errs)
			}
		})
	}
}
