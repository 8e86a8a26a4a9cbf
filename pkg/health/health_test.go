package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/discover"
	nvmlbackend "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// testSettings are short fault timings and the daemon's default critical
// XIDs.
func testSettings() Settings {
	return Settings{
		CriticalXIDs: map[uint64]bool{48: true, 62: true, 64: true, 79: true, 94: true, 95: true, 119: true, 120: true},
		UeventSettle: 50 * time.Millisecond,
		RecoverProbe: 100 * time.Millisecond,
	}
}

// ---- test harness: the simulated host and a manager over it, as the
// daemon wires them at start ----

// simEnv is the simulated host, its backends and a manager that has
// reconciled it.
type simEnv struct {
	h     *sim.Host
	nvml  *nvmlbackend.Backend
	sysfs *sysfs.Sysfs
	mgr   *manager.Manager
	logs  *testenv.Buffer
	log   *slog.Logger
}

func newSimEnv(t *testing.T) *simEnv {
	t.Helper()
	logs := &testenv.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", logs.String())
		}
	})
	h := simhost.Start(t, simhost.Options{
		Sim:       sim.OpenOptions{Logger: log.With("component", "sim")},
		NVML:      nvmlbackend.Options{Logger: log.With("component", "nvml")},
		Store:     store.Options{Logger: log.With("component", "store")},
		Manager:   manager.Config{Logger: log.With("component", "manager")},
		SimBootID: true,
	})
	return &simEnv{h: h.Sim, nvml: h.NVML, sysfs: h.Sysfs, mgr: h.Manager, logs: logs, log: log}
}

// watch starts a watcher over the host, as the daemon does, and returns
// it for its counters.
func (e *simEnv) watch(t *testing.T) *Watcher {
	t.Helper()
	n := strings.Count(e.logs.String(), "watching NVML events")
	w := New(Config{
		Manager:     e.mgr,
		GPUs:        discover.Host{NVML: e.nvml, Sysfs: e.sysfs},
		Events:      e.nvml,
		OpenUevents: e.h.UeventSource,
		Settings:    testSettings,
		Logger:      e.log.With("component", "faults"),
	})
	stop := w.Start(context.Background())
	t.Cleanup(stop)
	// The NVML event loop says when its GPUs are registered; before, an
	// XID would be missed.
	testenv.WaitFor(t, "the NVML event loop", 10*time.Second, func() bool {
		return strings.Count(e.logs.String(), "watching NVML events") > n
	})
	return w
}

// events collects manager events.
func events(t *testing.T, m *manager.Manager) func(kind manager.EventKind) []manager.Event {
	ch, cancel := m.Subscribe()
	var mu sync.Mutex
	var got []manager.Event
	go func() {
		for e := range ch {
			mu.Lock()
			got = append(got, e)
			mu.Unlock()
		}
	}()
	t.Cleanup(cancel)
	return func(kind manager.EventKind) []manager.Event {
		mu.Lock()
		defer mu.Unlock()
		var out []manager.Event
		for _, e := range got {
			if e.Kind == kind {
				out = append(out, e)
			}
		}
		return out
	}
}

// ---- fault tests ----

// TestFaultGPULostMidOperation: a GPU falls off the bus while vgpud
// carves on it. The operation fails with a named error, the GPU's other
// instances read lost, the manager keeps serving on the other GPUs, no
// record is lost, and when the GPU is back its instances are re-created.
func TestFaultGPULostMidOperation(t *testing.T) {
	e := newSimEnv(t)
	h, m := e.h, e.mgr
	w := e.watch(t)
	evs := events(t, m)
	simhost.DefineTenant(t, m, "acme")
	onLost := simhost.MustCreate(t, m, "acme", "1g.10gb", sim.DefaultH100MIG)
	elsewhere := simhost.MustCreate(t, m, "acme", "L4-4Q", sim.DefaultL4)

	if err := h.AddFault(sim.Fault{Op: "CreateGpuInstanceWithPlacement", GPU: sim.DefaultH100MIG, Delay: "1s", Count: 1}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		rec store.Instance
		err error
	}
	inflight := make(chan result, 1)
	go func() {
		r, err := m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "2g.20gb", GPU: sim.DefaultH100MIG})
		inflight <- result{r, err}
	}()
	testenv.WaitFor(t, "the in-flight GPU instance", 10*time.Second, func() bool {
		s, _ := h.Summary()
		return strings.Count(simhost.SummaryLine(s, sim.DefaultH100MIG), " gi") == 2
	})
	if err := h.LoseGPU(sim.DefaultH100MIG); err != nil {
		t.Fatal(err)
	}
	res := <-inflight
	if !errors.Is(res.err, manager.ErrGPULost) && !errors.Is(res.err, manager.ErrBackendFailure) {
		t.Fatalf("in-flight create on the lost GPU: %v, want a GPU-lost or backend failure", res.err)
	}
	testenv.WaitFor(t, "the instance on the lost GPU to read lost", 10*time.Second, func() bool {
		return simhost.InstanceStates(t, m)[onLost.UUID] == store.StateLost
	})
	if v := simhost.GPU(t, m, sim.DefaultH100MIG); v.State != "lost" {
		t.Fatalf("GPU state %q (%s), want lost", v.State, v.Reason)
	}
	if _, err := m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "1g.10gb", GPU: sim.DefaultH100MIG}); !errors.Is(err, manager.ErrGPULost) {
		t.Fatalf("create on the lost GPU: %v, want ErrGPULost", err)
	}
	// Still serving: reads and carving elsewhere.
	more := simhost.MustCreate(t, m, "acme", "L4-4Q", sim.DefaultL4)
	states := simhost.InstanceStates(t, m)
	for _, id := range []string{elsewhere.UUID, more.UUID} {
		if states[id] != store.StateReady {
			t.Fatalf("instance %s on a healthy GPU: %s", id, states[id])
		}
	}
	if xids := evs(manager.EventXID); len(xids) != 1 || xids[0].Detail != "79" || xids[0].ID != simhost.GPU(t, m, sim.DefaultH100MIG).UUID {
		t.Fatalf("XID events %+v, want one XID 79 for the lost GPU", xids)
	}

	if err := h.RecoverGPU(sim.DefaultH100MIG); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the GPU's instance to be re-created", 10*time.Second, func() bool {
		return simhost.InstanceStates(t, m)[onLost.UUID] == store.StateReady
	})
	if v := simhost.GPU(t, m, sim.DefaultH100MIG); v.State != "ok" {
		t.Fatalf("GPU state after recovery %q (%s)", v.State, v.Reason)
	}
	states = simhost.InstanceStates(t, m)
	for _, id := range []string{onLost.UUID, elsewhere.UUID, more.UUID} {
		if states[id] != store.StateReady {
			t.Fatalf("after recovery instance %s is %q; all: %v", id, states[id], states)
		}
	}
	if res.rec.UUID != "" {
		if _, ok := states[res.rec.UUID]; !ok {
			t.Fatalf("record of the interrupted create lost")
		}
	}
	if w.stats.Failures.Load() != 1 || w.stats.Recoveries.Load() != 1 {
		t.Fatalf("failures %d, recoveries %d, want 1 and 1", w.stats.Failures.Load(), w.stats.Recoveries.Load())
	}
	s, _ := h.Summary()
	t.Logf("after recovery: %s", simhost.SummaryLine(s, sim.DefaultH100MIG))
}

// TestFaultCriticalXIDOnAnsweringGPU: XID 48 on a GPU that still answers.
// The GPU reads failed with the reason, carving there is refused with a
// named error, the XID is published for metrics; it is not cleared by
// re-reading (it needs a reset), only when its PCI function is bound to
// the driver again.
func TestFaultCriticalXIDOnAnsweringGPU(t *testing.T) {
	e := newSimEnv(t)
	h, m := e.h, e.mgr
	simhost.DefineTenant(t, m, "acme")
	inst := simhost.MustCreate(t, m, "acme", "H100XM-4C", sim.DefaultH100TS)
	w := e.watch(t)
	evs := events(t, m)

	// An application fault: counted, the GPU stays in service.
	if err := h.InjectXID(sim.DefaultH100TS, 13, -1); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "XID 13 to be published", 10*time.Second, func() bool { return len(evs(manager.EventXID)) == 1 })
	if v := simhost.GPU(t, m, sim.DefaultH100TS); v.State != "ok" {
		t.Fatalf("after XID 13 the GPU is %q", v.State)
	}

	if err := h.InjectXID(sim.DefaultH100TS, 48, -1); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the GPU to read failed", 10*time.Second, func() bool { return simhost.GPU(t, m, sim.DefaultH100TS).State == "failed" })
	v := simhost.GPU(t, m, sim.DefaultH100TS)
	if !strings.Contains(v.Reason, "XID 48") || !strings.Contains(v.Reason, "reset") {
		t.Fatalf("reason %q", v.Reason)
	}
	if len(v.Instances) != 1 || v.Instances[0] != inst.UUID {
		t.Fatalf("failed GPU lists instances %v, want [%s]", v.Instances, inst.UUID)
	}
	_, err := m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "H100XM-4C", GPU: sim.DefaultH100TS})
	if !errors.Is(err, manager.ErrNoCapacity) || !strings.Contains(err.Error(), "XID 48") {
		t.Fatalf("create on the failed GPU: %v, want ErrNoCapacity naming XID 48", err)
	}
	// Events reach the collector goroutine on their own schedule: the GPU
	// may read failed before the XID event is in the list.
	testenv.WaitFor(t, "XID 48 to be published", 10*time.Second, func() bool { return len(evs(manager.EventXID)) >= 2 })
	xids := evs(manager.EventXID)
	if len(xids) != 2 || xids[1].Detail != "48" || xids[1].ID != v.UUID {
		t.Fatalf("XID events %+v", xids)
	}
	// Re-reading finds the GPU answering; that is not a reset.
	probes := w.stats.Probes.Load()
	testenv.WaitFor(t, "three probes of the failed GPU", 10*time.Second, func() bool { return w.stats.Probes.Load() >= probes+3 })
	if simhost.GPU(t, m, sim.DefaultH100TS).State != "failed" || w.stats.Recoveries.Load() != 0 {
		t.Fatal("an XID-failed GPU recovered without a reset")
	}
	// The reset: the PF is bound to nvidia again.
	if err := h.EmitUevent("bind", simhost.DevPath(sim.DefaultH100TS), "pci", map[string]string{"DRIVER": "nvidia", "PCI_ID": "10DE:2330"}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the GPU back in service", 10*time.Second, func() bool { return simhost.GPU(t, m, sim.DefaultH100TS).State == "ok" })
	// Its instance was failed with the GPU; the reconcile after the reset
	// brings it back.
	testenv.WaitFor(t, "the instance ready again", 10*time.Second, func() bool { return simhost.InstanceStates(t, m)[inst.UUID] == store.StateReady })
	simhost.MustCreate(t, m, "acme", "H100XM-4C", sim.DefaultH100TS)
}

// TestFaultUeventStorm: 1000 uevents from the simulated kernel while the
// manager serves. Every event is read, they cause a handful of re-reads,
// reads stay fast, and no record changes.
func TestFaultUeventStorm(t *testing.T) {
	e := newSimEnv(t)
	h, m := e.h, e.mgr
	simhost.DefineTenant(t, m, "acme")
	ids := []string{simhost.MustCreate(t, m, "acme", "1g.10gb", sim.DefaultH100MIG).UUID, simhost.MustCreate(t, m, "acme", "L4-4Q", sim.DefaultL4).UUID, simhost.MustCreate(t, m, "acme", "A10-4Q", sim.DefaultA10).UUID}
	// Watching starts after the creates: it sees only the storm.
	w := e.watch(t)
	before := w.stats.Uevents.Load()
	resyncsBefore := w.stats.Refreshes.Load() + w.stats.Reconciles.Load()

	const storm = 1000
	vfs := simhost.GPU(t, m, sim.DefaultH100TS).VGPU.VFs
	stopReads := make(chan struct{})
	var worst time.Duration
	var reads int
	readsDone := make(chan struct{})
	go func() {
		defer close(readsDone)
		for {
			select {
			case <-stopReads:
				return
			default:
			}
			t0 := time.Now()
			if _, err := m.GPUs(); err != nil {
				t.Errorf("read during the storm: %v", err)
				return
			}
			if _, err := m.AllInstances(); err != nil {
				t.Errorf("read during the storm: %v", err)
				return
			}
			worst = max(worst, time.Since(t0))
			reads++
			time.Sleep(5 * time.Millisecond)
		}
	}()
	t0 := time.Now()
	for i := 0; i < storm; i++ {
		var err error
		switch i % 4 {
		case 0: // a VF's type written and cleared by someone else's tool
			err = h.EmitUevent("change", simhost.DevPath(vfs[i%len(vfs)].PCI), "pci", map[string]string{"NVIDIA_VGPU_TYPE": "0"})
		case 1:
			err = h.EmitUevent("add", simhost.DevPath(sim.DefaultA10)+"/"+fmt.Sprintf("00000000-0000-4000-8000-%012d", i), "mdev", nil)
		case 2: // another vendor's device: read, ignored
			err = h.EmitUevent("add", "devices/pci0000:00/0000:00:1f."+fmt.Sprint(i%8), "pci", map[string]string{"PCI_ID": "8086:A0A3"})
		default:
			err = h.EmitUevent("change", simhost.DevPath(vfs[i%len(vfs)].PCI), "pci", map[string]string{"NVIDIA_VGPU_TYPE": "893"})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	emitted := time.Since(t0)
	testenv.WaitFor(t, "every storm uevent to be read", 60*time.Second, func() bool { return w.stats.Uevents.Load()-before >= storm })
	// The last batch is handled within stormFactor settle periods.
	testenv.WaitFor(t, "the storm's last re-read", 30*time.Second, func() bool {
		return len(w.uev) == 0 && w.stats.Batched.Load() == 0
	})
	close(stopReads)
	<-readsDone
	resyncs := w.stats.Refreshes.Load() + w.stats.Reconciles.Load() - resyncsBefore
	t.Logf("storm: %d uevents emitted in %v, read %d (relevant %d, overflows %d), re-reads %d (reconciles %d), %d reads during it, slowest %v",
		storm, emitted.Round(time.Millisecond), w.stats.Uevents.Load()-before, w.stats.Relevant.Load(), w.stats.Overflows.Load(),
		resyncs, w.stats.Reconciles.Load(), reads, worst.Round(time.Microsecond))
	// Batched (a bound on events per re-read, not on time: quiet gaps of a
	// slow emitter each end a batch), and the manager kept answering reads.
	if limit := int64(storm / 20); resyncs > limit || resyncs == 0 {
		t.Fatalf("%d re-reads for %d uevents over %v, want 1..%d", resyncs, storm, emitted, limit)
	}
	if reads == 0 {
		t.Fatal("no read was answered during the storm")
	}
	states := simhost.InstanceStates(t, m)
	if len(states) != len(ids) {
		t.Fatalf("records %v, want %d", states, len(ids))
	}
	for _, id := range ids {
		if states[id] != store.StateReady {
			t.Fatalf("instance %s is %s after the storm", id, states[id])
		}
	}
}
