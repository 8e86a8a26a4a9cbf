package manager_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/vgpud/vgpud/internal/invariant"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// hostClean fails when records and host disagree (internal/invariant).
func hostClean(t *testing.T, e *env) {
	t.Helper()
	if err := e.m.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	recs, err := e.m.AllInstances()
	if err != nil {
		t.Fatal(err)
	}
	var rs []store.Instance
	for _, r := range recs {
		rs = append(rs, r.Instance)
	}
	if extra, missing := invariant.HostDiff(e.m.Inventory(), rs); len(extra)+len(missing) > 0 {
		t.Fatalf("host and records differ: extra %v, missing %v\n%s", extra, missing, e.summary())
	}
}

// Three 1c.3g.40gb fill one 3g.40gb GPU instance at compute slices 0, 1
// and 2; the GPU instance goes with the last of them.
func TestComputeInstancesShareAGPUInstance(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	empty := e.summary()
	var made []store.Instance
	for i := 0; i < 3; i++ {
		r := e.mustCreate("acme", "1c.3g.40gb", sim.DefaultH100MIG)
		if r.Kind != store.KindMIG || r.CISlices != 1 || r.CIStart != i || r.CIProfileID != 0 || r.GIProfileID != 9 {
			t.Fatalf("compute instance %d: %+v", i, r)
		}
		if i == 1 {
			// Plan says where the next goes: into the same GPU instance.
			p, err := e.m.Plan(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "1c.3g.40gb", GPU: sim.DefaultH100MIG})
			if err != nil || !p.Fits || p.Start != made[0].GIStart || p.ComputeMilli != tenant.MIGComputeMilli(1, 7) {
				t.Fatalf("plan of a second 1c.3g.40gb: %+v, %v", p, err)
			}
		}
		if i > 0 && (r.GIID != made[0].GIID || r.GIStart != made[0].GIStart) {
			t.Fatalf("compute instance %d in GPU instance %d@%d, the first in %d@%d", i, r.GIID, r.GIStart, made[0].GIID, made[0].GIStart)
		}
		made = append(made, r)
	}
	if got := strings.Count(e.summary(), "ci=3"); got != 1 {
		t.Fatalf("want one GPU instance with three compute instances:\n%s", e.summary())
	}
	md, _ := e.cat.Model("H100-SXM5-80GB")
	gi, _ := md.GPUInstanceProfileByName("3g.40gb")
	want := tenant.MIGComputeMilli(1, 7)
	for _, r := range made {
		if r.ComputeMilli != want || r.VRAMBytes != (gi.MemoryMiB<<20)/3 {
			t.Fatalf("cost of %s: %d milli, %d bytes", r.UUID, r.ComputeMilli, r.VRAMBytes)
		}
	}
	hostClean(t, e)
	// A fourth: that GPU instance has no room, another one is made.
	fourth := e.mustCreate("acme", "1c.3g.40gb", sim.DefaultH100MIG)
	if fourth.GIStart == made[0].GIStart || fourth.CIStart != 0 {
		t.Fatalf("fourth compute instance %+v, want a new GPU instance", fourth)
	}
	for i, r := range append(made, fourth) {
		if err := e.m.Destroy(context.Background(), r.UUID, manager.DestroyOptions{}); err != nil {
			t.Fatalf("destroy %d: %v", i, err)
		}
		hostClean(t, e)
		if i == 0 && !strings.Contains(e.summary(), "ci=2") {
			t.Fatalf("after the first destroy the GPU instance should hold two:\n%s", e.summary())
		}
	}
	if got := e.summary(); got != empty {
		t.Fatalf("host not back to empty:\n%s\nwant\n%s", got, empty)
	}
}

func TestComputeInstanceRefusals(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	for _, p := range []string{"4c.3g.40gb", "0c.3g.40gb", "1c.5g.40gb", "2c.1g.10gb"} {
		if _, err := e.create("acme", p, ""); !errors.Is(err, manager.ErrInvalidArgument) {
			t.Fatalf("%s: %v, want ErrInvalidArgument", p, err)
		}
	}
	_, err := e.create("acme", "4c.3g.40gb", "")
	if msg := manager.Message(err); !strings.Contains(msg, "offers 1c.3g.40gb, 2c.3g.40gb, 3g.40gb") {
		t.Fatalf("4c.3g.40gb refused with %q; want the sizes a 3g.40gb offers", msg)
	}
	// Six 1c fill the two 3g.40gb an H100 holds; the seventh has no room.
	for i := 0; i < 6; i++ {
		e.mustCreate("acme", "1c.3g.40gb", sim.DefaultH100MIG)
	}
	before := e.summary()
	if _, err := e.create("acme", "1c.3g.40gb", sim.DefaultH100MIG); !errors.Is(err, manager.ErrNoCapacity) {
		t.Fatalf("seventh 1c.3g.40gb: %v, want ErrNoCapacity", err)
	}
	if _, err := e.create("acme", "2c.3g.40gb", sim.DefaultH100MIG); !errors.Is(err, manager.ErrNoCapacity) {
		t.Fatalf("2c.3g.40gb on a full GPU: %v, want ErrNoCapacity", err)
	}
	if e.summary() != before {
		t.Fatalf("a refusal changed the host:\n%s\nwas\n%s", e.summary(), before)
	}
	hostClean(t, e)
}

// A compute instance costs its share of the GPU instance: a third of a
// 3g.40gb is 13 GiB, so two fit a 30 GiB quota and a third does not.
func TestComputeInstanceQuota(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("small", tenant.Quota{VRAMBytes: 30 << 30, ComputeMilli: tenant.Unlimited, MaxInstances: tenant.Unlimited})
	e.tenant("slices", tenant.Quota{VRAMBytes: tenant.Unlimited, ComputeMilli: 300, MaxInstances: tenant.Unlimited})
	e.mustCreate("small", "1c.3g.40gb", "")
	e.mustCreate("small", "1c.3g.40gb", "")
	before := e.summary()
	if _, err := e.create("small", "1c.3g.40gb", ""); !errors.Is(err, manager.ErrQuotaExceeded) {
		t.Fatalf("third 1c for a 30 GiB quota: %v, want ErrQuotaExceeded", err)
	}
	// 300 milli-GPU: two 1c (142 each) but not a 2c (285) beside them.
	e.mustCreate("slices", "1c.3g.40gb", "")
	e.mustCreate("slices", "1c.3g.40gb", "")
	if _, err := e.create("slices", "1c.3g.40gb", ""); !errors.Is(err, manager.ErrQuotaExceeded) {
		t.Fatalf("third 1c for 300 milli-GPU: %v, want ErrQuotaExceeded", err)
	}
	if !strings.Contains(e.summary(), "ci=2") || strings.Count(e.summary(), "gi") != 2 {
		t.Fatalf("want two GPU instances of two compute instances:\n%s\nbefore:\n%s", e.summary(), before)
	}
	hostClean(t, e)
}

// A GPU instance holds one tenant's compute instances, and a
// compute-instance GPU instance never takes a MIG-backed vGPU.
func TestComputeInstanceNeighbours(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	e.tenant("other", unlimited())
	a := e.mustCreate("acme", "1c.3g.40gb", sim.DefaultH100MIG)
	v := e.mustCreate("acme", "H100XM-3-40C", "")
	if v.GPUUUID == a.GPUUUID && v.GIStart == a.GIStart {
		t.Fatalf("MIG-backed vGPU in a compute-instance GPU instance: %+v", v)
	}
	before := e.summary()
	// The H100 has no 3g.40gb left, and acme's has room only for acme.
	if _, err := e.create("other", "1c.3g.40gb", sim.DefaultH100MIG); !errors.Is(err, manager.ErrNoCapacity) {
		t.Fatalf("other's 1c.3g.40gb: %v, want ErrNoCapacity", err)
	}
	// 2c starts only at 0, where acme's 1c sits.
	if _, err := e.create("acme", "2c.3g.40gb", sim.DefaultH100MIG); !errors.Is(err, manager.ErrNoCapacity) {
		t.Fatalf("2c.3g.40gb: %v, want ErrNoCapacity", err)
	}
	if e.summary() != before {
		t.Fatalf("a refusal changed the host:\n%s\nwas\n%s", e.summary(), before)
	}
	e.mustCreate("acme", "1c.3g.40gb", sim.DefaultH100MIG)
	hostClean(t, e)
}

func TestComputeInstancesAfterReboot(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	var made []store.Instance
	for _, p := range []string{"1c.3g.40gb", "1c.3g.40gb", "2c.4g.40gb", "1c.3g.40gb"} {
		made = append(made, e.mustCreate("acme", p, sim.DefaultH100MIG))
	}
	// Leave a hole at slice 0 of the 3g: the reboot must re-create the
	// others at their own starts.
	if err := e.m.Destroy(context.Background(), made[0].UUID, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	before := e.summary()
	if err := e.sim.Reboot(); err != nil {
		t.Fatal(err)
	}
	rep := e.restart()
	if len(rep.Recreated) != 3 || len(rep.Failed) != 0 {
		t.Fatalf("report %+v", rep)
	}
	if got := e.summary(); got != before {
		t.Fatalf("after reboot:\n%s\nbefore:\n%s", got, before)
	}
	for _, want := range made[1:] {
		got, err := e.m.Instance(want.UUID)
		if err != nil || got.GIStart != want.GIStart || got.CIStart != want.CIStart || got.State != store.StateReady {
			t.Fatalf("record %+v after reboot, was %+v (%v)", got, want, err)
		}
	}
	hostClean(t, e)
	assertConsistent(t, e)
}

// A crash at each create and destroy point of a compute instance that
// shares its GPU instance is finished or undone by the next start, and
// the sibling keeps its compute instance.
func TestComputeInstanceCrashPoints(t *testing.T) {
	points := []string{manager.CrashCreateIntent, manager.CrashCreateGI, manager.CrashCreateCI, manager.CrashCreateCommit,
		manager.CrashDestroyStart, manager.CrashDestroyCI, manager.CrashDestroyGI}
	for _, p := range points {
		t.Run(p, func(t *testing.T) {
			e := newEnv(t, nil)
			e.tenant("acme", unlimited())
			sibling := e.mustCreate("acme", "1c.3g.40gb", sim.DefaultH100MIG)
			var keep store.Instance
			if strings.HasPrefix(p, "destroy") {
				keep = e.mustCreate("acme", "1c.3g.40gb", sim.DefaultH100MIG)
			}
			e.crash = func(at string) {
				if at == p {
					runtime.Goexit()
				}
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				if keep.UUID != "" {
					_ = e.m.Destroy(context.Background(), keep.UUID, manager.DestroyOptions{})
				} else {
					_, _ = e.create("acme", "1c.3g.40gb", sim.DefaultH100MIG)
				}
			}()
			<-done
			e.restart()
			assertConsistent(t, e)
			hostClean(t, e)
			if got, err := e.m.Instance(sibling.UUID); err != nil || got.State != store.StateReady || got.CIStart != 0 {
				t.Fatalf("sibling after the crash: %+v, %v", got, err)
			}
			// The sibling still goes cleanly, and takes the GPU instance
			// with it when it is the last.
			insts, _ := e.m.AllInstances()
			for _, in := range insts {
				if err := e.m.Destroy(context.Background(), in.UUID, manager.DestroyOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if strings.Contains(e.summary(), "gi") {
				t.Fatalf("GPU instance left:\n%s", e.summary())
			}
		})
	}
}

// Compute instances of one GPU instance destroyed at the same moment: the
// last record to go takes the GPU instance with it, however the destroys
// interleave (each drops its record under the GPU's lock).
func TestConcurrentDestroysOfSharersLeaveNoGPUInstance(t *testing.T) {
	for round := 0; round < 20; round++ {
		e := newEnv(t, nil)
		e.tenant("acme", unlimited())
		empty := e.summary()
		var made []store.Instance
		for i := 0; i < 3; i++ {
			made = append(made, e.mustCreate("acme", "1c.3g.40gb", sim.DefaultH100MIG))
		}
		errs := make(chan error, len(made))
		for _, r := range made {
			go func() { errs <- e.m.Destroy(context.Background(), r.UUID, manager.DestroyOptions{}) }()
		}
		for range made {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: destroy: %v", round, err)
			}
		}
		hostClean(t, e)
		if got := e.summary(); got != empty {
			t.Fatalf("round %d: a GPU instance was left behind:\n%s\nwant\n%s", round, got, empty)
		}
	}
}

// admitBarrier holds every create at its first step after admission until
// n creates have been admitted or refused, so all of them are decided
// while the others are in flight (none has carved yet).
type admitBarrier struct {
	mu      sync.Mutex
	cond    *sync.Cond
	n, seen int
}

func newAdmitBarrier(n int) *admitBarrier {
	b := &admitBarrier{n: n}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// arrive counts one create decided and waits for the rest.
func (b *admitBarrier) arrive(wait bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seen++
	b.cond.Broadcast()
	for wait && b.seen < b.n {
		b.cond.Wait()
	}
}

// Six compute instances created at once on an empty MIG GPU that has room
// for six (two 3g.40gb GPU instances of three compute slices): every one
// is admitted, and they fill two GPU instances, three each, though each
// was decided while the others were still being created (a GPU instance
// being made by an in-flight create is joined, not duplicated).
func TestParallelComputeInstanceCreates(t *testing.T) {
	for round := 0; round < 5; round++ {
		e := newEnv(t, nil)
		e.tenant("acme", unlimited())
		const n = 6
		b := newAdmitBarrier(n)
		e.crash = func(p string) {
			if p == manager.CrashCreateIntent {
				b.arrive(true)
			}
		}
		type result struct {
			r   store.Instance
			err error
		}
		res := make(chan result, n)
		for range n {
			go func() {
				r, err := e.create("acme", "1c.3g.40gb", sim.DefaultH100MIG)
				if err != nil && !errors.Is(err, manager.ErrBusy) {
					// Refused at admission: it never reaches the barrier.
					b.arrive(false)
				}
				res <- result{r, err}
			}()
		}
		perGI := map[int]int{}
		for range n {
			x := <-res
			if x.err != nil {
				t.Fatalf("round %d: parallel create: %v\n%s", round, x.err, e.summary())
			}
			perGI[x.r.GIID]++
		}
		e.crash = nil
		if len(perGI) != 2 || perGI[-1] != 0 {
			t.Fatalf("round %d: compute instances per GPU instance %v, want two GPU instances of three\n%s", round, perGI, e.summary())
		}
		for gi, k := range perGI {
			if k != 3 {
				t.Fatalf("round %d: GPU instance %d holds %d compute instances, want 3\n%s", round, gi, k, e.summary())
			}
		}
		hostClean(t, e)
	}
}

// Two compute instances of one tenant created at once share one GPU
// instance, whichever carve reaches the GPU first.
func TestParallelComputeInstancesShareOneGPUInstance(t *testing.T) {
	for round := 0; round < 10; round++ {
		e := newEnv(t, nil)
		e.tenant("acme", unlimited())
		b := newAdmitBarrier(2)
		e.crash = func(p string) {
			if p == manager.CrashCreateIntent {
				b.arrive(true)
			}
		}
		errs := make(chan error, 2)
		for range 2 {
			go func() {
				_, err := e.create("acme", "1c.3g.40gb", sim.DefaultH100MIG)
				errs <- err
			}()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		e.crash = nil
		if got := strings.Count(e.summary(), "ci=2"); got != 1 {
			t.Fatalf("round %d: want one GPU instance holding both compute instances:\n%s", round, e.summary())
		}
		hostClean(t, e)
	}
}
