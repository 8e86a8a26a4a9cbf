package manager_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// overlapFS counts the current_vgpu_type writes in flight at once. While
// armed, a write waits (at most a second) until want writes are in flight,
// so a pass that carves GPUs one after another shows 1 and one that carves
// them side by side shows want, however the goroutines are scheduled.
type overlapFS struct {
	sysfs.FS
	armed atomic.Bool
	want  int32

	mu   sync.Mutex
	cond *sync.Cond
	in   int32
	most int32
}

func (f *overlapFS) WriteFile(name string, data []byte) error {
	if !f.armed.Load() || !strings.HasSuffix(name, "/current_vgpu_type") || string(data) == "0" {
		return f.FS.WriteFile(name, data)
	}
	f.mu.Lock()
	f.in++
	f.most = max(f.most, f.in)
	f.cond.Broadcast()
	deadline := time.Now().Add(time.Second)
	for f.in < f.want && time.Now().Before(deadline) {
		go func() { time.Sleep(10 * time.Millisecond); f.cond.Broadcast() }()
		f.cond.Wait()
	}
	f.mu.Unlock()
	err := f.FS.WriteFile(name, data)
	f.mu.Lock()
	f.in--
	f.mu.Unlock()
	return err
}

func newOverlapEnv(t *testing.T, gpus int) (*env, *overlapFS) {
	t.Helper()
	e := &env{t: t}
	ov := &overlapFS{want: int32(gpus)}
	ov.cond = sync.NewCond(&ov.mu)
	e.host = simhost.Start(t, simhost.Options{
		Spec: bigHost(gpus),
		FS:   func(h *sim.Host) sysfs.FS { ov.FS = h.FS(); return ov },
		Manager: manager.Config{
			Crash:     func(p string) { e.crashAt(p) },
			BusyRetry: 1,
		},
		SimBootID: true,
	})
	e.cat, e.sim, e.db, e.m = e.host.Catalog, e.host.Sim, e.host.DB, e.host.Manager
	return e, ov
}

// After a reboot the start-up reconcile carves every GPU at once: the
// driver calls of different GPUs are in flight together.
func TestRecoveryCarvesGPUsInParallel(t *testing.T) {
	const gpus, per = 4, 3
	e, ov := newOverlapEnv(t, gpus)
	e.tenant("acme", unlimited())
	for g := 0; g < gpus; g++ {
		for i := 0; i < per; i++ {
			e.mustCreate("acme", "H200X-4C", bigHost(gpus).GPUs[g].PCI)
		}
	}
	if err := e.sim.Reboot(); err != nil {
		t.Fatal(err)
	}
	ov.armed.Store(true)
	rep := e.restart()
	ov.armed.Store(false)
	if len(rep.Recreated) != gpus*per || len(rep.Failed) != 0 {
		t.Fatalf("re-created %d of %d, failed %v", len(rep.Recreated), gpus*per, rep.Failed)
	}
	if ov.most != gpus {
		t.Fatalf("at most %d vGPU writes in flight at once, want %d (one per GPU)", ov.most, gpus)
	}
	if rep2, err := e.m.Reconcile(context.Background()); err != nil || len(rep2.Recreated)+len(rep2.Failed)+len(rep2.Foreign) != 0 {
		t.Fatalf("second reconcile: %+v, %v", rep2, err)
	}
}

// A crash inside the parallel pass (one GPU's worker stops after it
// re-created an instance while the others carve on) converges at the
// next start: every instance ready, nothing foreign, nothing left to do.
func TestRecoveryCrashInsideParallelPass(t *testing.T) {
	const gpus, per = 3, 2
	for _, nth := range []int32{1, 3, gpus * per} {
		e, _ := newOverlapEnv(t, gpus)
		e.tenant("acme", unlimited())
		for g := 0; g < gpus; g++ {
			for i := 0; i < per; i++ {
				e.mustCreate("acme", "H200X-4C", bigHost(gpus).GPUs[g].PCI)
			}
		}
		if err := e.sim.Reboot(); err != nil {
			t.Fatal(err)
		}
		var hits atomic.Int32
		e.crash = func(p string) {
			if p == manager.CrashRestore && hits.Add(1) == nth {
				runtime.Goexit()
			}
		}
		if _, err := e.m.Reconcile(context.Background()); err != nil {
			t.Fatal(err)
		}
		rep := e.restart()
		if len(rep.Failed)+len(rep.Foreign) != 0 {
			t.Fatalf("crash at re-create %d: restart failed %v, foreign %v", nth, rep.Failed, rep.Foreign)
		}
		for id, st := range simhost.InstanceStates(t, e.m) {
			if st != store.StateReady {
				t.Fatalf("crash at re-create %d: instance %s is %s", nth, id, st)
			}
		}
		if rep2, err := e.m.Reconcile(context.Background()); err != nil || len(rep2.Recreated)+len(rep2.Failed)+len(rep2.Foreign) != 0 {
			t.Fatalf("crash at re-create %d: second reconcile: %+v, %v", nth, rep2, err)
		}
	}
}

// A MIG mode change keeps the admission lock only for its decision: while
// the driver works on one GPU's mode, creates on other GPUs are admitted
// and carved, and one aimed at the switching GPU is refused at once.
func TestModeChangeLeavesAdmissionFree(t *testing.T) {
	no := false
	e := newEnv(t, &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{
		{Model: "H100-SXM5-80GB", PCI: sim.DefaultH100MIG, Flavour: gpu.FlavourVFIO, VFs: &no},
		{Model: "L4-24GB", PCI: sim.DefaultL4, Flavour: gpu.FlavourVFIO},
	}})
	e.tenant("acme", unlimited())
	// The mode change takes until the test lets it go (a slow driver).
	if err := e.sim.AddFault(sim.Fault{Op: "SetMigMode", Delay: "3s", Count: 1}); err != nil {
		t.Fatal(err)
	}
	modeDone := make(chan error, 1)
	go func() { modeDone <- e.m.SetMIGMode(context.Background(), sim.DefaultH100MIG, true) }()
	// Wait until the driver call is in flight: the GPU refuses creates.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := e.create("acme", "H100XM-10C", sim.DefaultH100MIG)
		if err != nil && strings.Contains(manager.Message(err), "MIG mode is being changed") {
			break
		}
		if err == nil || time.Now().After(deadline) {
			t.Fatalf("create on the switching GPU: %v, want a refusal naming the mode change", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := e.create("acme", "L4-4Q", sim.DefaultL4); err != nil {
		t.Fatalf("create on another GPU during the mode change: %v", err)
	}
	select {
	case err := <-modeDone:
		t.Fatalf("the mode change returned (%v) before the create on the other GPU was admitted", err)
	default:
	}
	if err := <-modeDone; err != nil {
		t.Fatal(err)
	}
	e.mustCreate("acme", "1g.10gb", sim.DefaultH100MIG)
}

// Creates on different GPUs do not queue behind one another: admission
// decides and lets go, and each GPU's driver calls run beside the others'.
func TestCreatesOnDifferentGPUsOverlap(t *testing.T) {
	const gpus = 4
	e, ov := newOverlapEnv(t, gpus)
	e.tenant("acme", unlimited())
	ov.armed.Store(true)
	var wg sync.WaitGroup
	errs := make(chan error, gpus)
	for g := 0; g < gpus; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.create("acme", "H200X-4C", bigHost(gpus).GPUs[g].PCI)
			errs <- err
		}()
	}
	wg.Wait()
	ov.armed.Store(false)
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if ov.most != gpus {
		t.Fatalf("at most %d vGPU writes in flight at once, want %d (one per GPU)", ov.most, gpus)
	}
}
