package health

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/discover"
	nvmlbackend "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
	"github.com/vgpud/vgpud/profiles"
)

// The built-in simulated host (pkg/gpu/sim DefaultSpec).
const (
	simH100MIG = "0000:41:00.0" // H100, MIG on, vendor VFIO
	simH100TS  = "0000:61:00.0" // H100, time-sliced vGPUs on VFs
	simL4      = "0000:81:00.0"
	simA10     = "0000:a1:00.0" // legacy mdev on VFs
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

// syncBuf collects log output from several goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// simEnv is the simulated host, its backends and a manager that has
// reconciled it.
type simEnv struct {
	h     *sim.Host
	nvml  *nvmlbackend.Backend
	sysfs *sysfs.Sysfs
	mgr   *manager.Manager
	logs  *syncBuf
	log   *slog.Logger
}

func newSimEnv(t *testing.T) *simEnv {
	t.Helper()
	logs := &syncBuf{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", logs.String())
		}
	})
	cat, err := profile.Load(profiles.FS, "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	h, err := sim.Open(filepath.Join(dir, "sim"), nil, cat, sim.OpenOptions{Logger: log.With("component", "sim")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	e := &simEnv{h: h, logs: logs, log: log, sysfs: sysfs.New(h.FS())}
	e.nvml = nvmlbackend.New(h.NVML(), cat, nvmlbackend.Options{Logger: log.With("component", "nvml")})
	ctx := context.Background()
	if err := e.nvml.Init(ctx); err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(filepath.Join(dir, "state.db"), store.Options{Logger: log.With("component", "store")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	boot := func() string { id, _ := h.BootID(); return id }
	e.mgr = manager.New(cat, db, e.nvml, e.sysfs, discover.Host{NVML: e.nvml, Sysfs: e.sysfs}, nil,
		manager.Options{Logger: log.With("component", "manager"), BootID: boot})
	if _, err := e.mgr.Reconcile(ctx); err != nil {
		t.Fatalf("reconcile at start: %v", err)
	}
	return e
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
	waitFor(t, "the NVML event loop", 10*time.Second, func() bool {
		return strings.Count(e.logs.String(), "watching NVML events") > n
	})
	return w
}

// waitFor polls cond (state that no event announces) until it holds.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func defineTenant(t *testing.T, m *manager.Manager, name string) {
	t.Helper()
	if _, err := m.DefineTenant(context.Background(), tenant.Tenant{Name: name, Quota: tenant.UnlimitedQuota()}); err != nil {
		t.Fatal(err)
	}
}

func mustCreate(t *testing.T, m *manager.Manager, profile, gpu string) store.Instance {
	t.Helper()
	r, err := m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: profile, GPU: gpu})
	if err != nil {
		t.Fatalf("create %s on %s: %v", profile, gpu, err)
	}
	return r
}

func instanceStates(t *testing.T, m *manager.Manager) map[string]store.InstanceState {
	t.Helper()
	views, err := m.AllInstances()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]store.InstanceState{}
	for _, v := range views {
		out[v.UUID] = v.State
	}
	return out
}

func gpuState(t *testing.T, m *manager.Manager, pci string) manager.GPUView {
	t.Helper()
	v, err := m.GPU(pci)
	if err != nil {
		t.Fatalf("GPU %s: %v", pci, err)
	}
	return v
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

func simDevPath(pci string) string { return "devices/pci0000:00/" + pci }

func firstLine(summary, pci string) string {
	for _, l := range strings.Split(summary, "\n") {
		if strings.HasPrefix(l, pci) {
			return l
		}
	}
	return ""
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
	defineTenant(t, m, "acme")
	onLost := mustCreate(t, m, "1g.10gb", simH100MIG)
	elsewhere := mustCreate(t, m, "L4-4Q", simL4)

	if err := h.AddFault(sim.Fault{Op: "CreateGpuInstanceWithPlacement", GPU: simH100MIG, Delay: "1s", Count: 1}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		rec store.Instance
		err error
	}
	inflight := make(chan result, 1)
	go func() {
		r, err := m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "2g.20gb", GPU: simH100MIG})
		inflight <- result{r, err}
	}()
	waitFor(t, "the in-flight GPU instance", 10*time.Second, func() bool {
		s, _ := h.Summary()
		return strings.Count(firstLine(s, simH100MIG), " gi") == 2
	})
	if err := h.LoseGPU(simH100MIG); err != nil {
		t.Fatal(err)
	}
	res := <-inflight
	if !errors.Is(res.err, manager.ErrGPULost) && !errors.Is(res.err, manager.ErrBackendFailure) {
		t.Fatalf("in-flight create on the lost GPU: %v, want a GPU-lost or backend failure", res.err)
	}
	waitFor(t, "the instance on the lost GPU to read lost", 10*time.Second, func() bool {
		return instanceStates(t, m)[onLost.UUID] == store.StateLost
	})
	if v := gpuState(t, m, simH100MIG); v.State != "lost" {
		t.Fatalf("GPU state %q (%s), want lost", v.State, v.Reason)
	}
	if _, err := m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "1g.10gb", GPU: simH100MIG}); !errors.Is(err, manager.ErrGPULost) {
		t.Fatalf("create on the lost GPU: %v, want ErrGPULost", err)
	}
	// Still serving: reads and carving elsewhere.
	more := mustCreate(t, m, "L4-4Q", simL4)
	states := instanceStates(t, m)
	for _, id := range []string{elsewhere.UUID, more.UUID} {
		if states[id] != store.StateReady {
			t.Fatalf("instance %s on a healthy GPU: %s", id, states[id])
		}
	}
	if xids := evs(manager.EventXID); len(xids) != 1 || xids[0].Detail != "79" || xids[0].ID != gpuState(t, m, simH100MIG).UUID {
		t.Fatalf("XID events %+v, want one XID 79 for the lost GPU", xids)
	}

	if err := h.RecoverGPU(simH100MIG); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the GPU's instance to be re-created", 10*time.Second, func() bool {
		return instanceStates(t, m)[onLost.UUID] == store.StateReady
	})
	if v := gpuState(t, m, simH100MIG); v.State != "ok" {
		t.Fatalf("GPU state after recovery %q (%s)", v.State, v.Reason)
	}
	states = instanceStates(t, m)
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
	t.Logf("after recovery: %s", firstLine(s, simH100MIG))
}

// TestFaultCriticalXIDOnAnsweringGPU: XID 48 on a GPU that still answers.
// The GPU reads failed with the reason, carving there is refused with a
// named error, the XID is published for metrics; it is not cleared by
// re-reading (it needs a reset), only when its PCI function is bound to
// the driver again.
func TestFaultCriticalXIDOnAnsweringGPU(t *testing.T) {
	e := newSimEnv(t)
	h, m := e.h, e.mgr
	defineTenant(t, m, "acme")
	inst := mustCreate(t, m, "H100XM-4C", simH100TS)
	w := e.watch(t)
	evs := events(t, m)

	// An application fault: counted, the GPU stays in service.
	if err := h.InjectXID(simH100TS, 13, -1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "XID 13 to be published", 10*time.Second, func() bool { return len(evs(manager.EventXID)) == 1 })
	if v := gpuState(t, m, simH100TS); v.State != "ok" {
		t.Fatalf("after XID 13 the GPU is %q", v.State)
	}

	if err := h.InjectXID(simH100TS, 48, -1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the GPU to read failed", 10*time.Second, func() bool { return gpuState(t, m, simH100TS).State == "failed" })
	v := gpuState(t, m, simH100TS)
	if !strings.Contains(v.Reason, "XID 48") || !strings.Contains(v.Reason, "reset") {
		t.Fatalf("reason %q", v.Reason)
	}
	if len(v.Instances) != 1 || v.Instances[0] != inst.UUID {
		t.Fatalf("failed GPU lists instances %v, want [%s]", v.Instances, inst.UUID)
	}
	_, err := m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "H100XM-4C", GPU: simH100TS})
	if !errors.Is(err, manager.ErrNoCapacity) || !strings.Contains(err.Error(), "XID 48") {
		t.Fatalf("create on the failed GPU: %v, want ErrNoCapacity naming XID 48", err)
	}
	// Events reach the collector goroutine on their own schedule: the GPU
	// may read failed before the XID event is in the list.
	waitFor(t, "XID 48 to be published", 10*time.Second, func() bool { return len(evs(manager.EventXID)) >= 2 })
	xids := evs(manager.EventXID)
	if len(xids) != 2 || xids[1].Detail != "48" || xids[1].ID != v.UUID {
		t.Fatalf("XID events %+v", xids)
	}
	// Re-reading finds the GPU answering; that is not a reset.
	probes := w.stats.Probes.Load()
	waitFor(t, "three probes of the failed GPU", 10*time.Second, func() bool { return w.stats.Probes.Load() >= probes+3 })
	if gpuState(t, m, simH100TS).State != "failed" || w.stats.Recoveries.Load() != 0 {
		t.Fatal("an XID-failed GPU recovered without a reset")
	}
	// The reset: the PF is bound to nvidia again.
	if err := h.EmitUevent("bind", simDevPath(simH100TS), "pci", map[string]string{"DRIVER": "nvidia", "PCI_ID": "10DE:2330"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the GPU back in service", 10*time.Second, func() bool { return gpuState(t, m, simH100TS).State == "ok" })
	// Its instance was failed with the GPU; the reconcile after the reset
	// brings it back.
	waitFor(t, "the instance ready again", 10*time.Second, func() bool { return instanceStates(t, m)[inst.UUID] == store.StateReady })
	mustCreate(t, m, "H100XM-4C", simH100TS)
}

// TestFaultUeventStorm: 1000 uevents from the simulated kernel while the
// manager serves. Every event is read, they cause a handful of re-reads,
// reads stay fast, and no record changes.
func TestFaultUeventStorm(t *testing.T) {
	e := newSimEnv(t)
	h, m := e.h, e.mgr
	defineTenant(t, m, "acme")
	ids := []string{mustCreate(t, m, "1g.10gb", simH100MIG).UUID, mustCreate(t, m, "L4-4Q", simL4).UUID, mustCreate(t, m, "A10-4Q", simA10).UUID}
	// Watching starts after the creates: it sees only the storm.
	w := e.watch(t)
	before := w.stats.Uevents.Load()
	resyncsBefore := w.stats.Refreshes.Load() + w.stats.Reconciles.Load()

	const storm = 1000
	vfs := gpuState(t, m, simH100TS).VGPU.VFs
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
			err = h.EmitUevent("change", simDevPath(vfs[i%len(vfs)].PCI), "pci", map[string]string{"NVIDIA_VGPU_TYPE": "0"})
		case 1:
			err = h.EmitUevent("add", simDevPath(simA10)+"/"+fmt.Sprintf("00000000-0000-4000-8000-%012d", i), "mdev", nil)
		case 2: // another vendor's device: read, ignored
			err = h.EmitUevent("add", "devices/pci0000:00/0000:00:1f."+fmt.Sprint(i%8), "pci", map[string]string{"PCI_ID": "8086:A0A3"})
		default:
			err = h.EmitUevent("change", simDevPath(vfs[i%len(vfs)].PCI), "pci", map[string]string{"NVIDIA_VGPU_TYPE": "893"})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	emitted := time.Since(t0)
	waitFor(t, "every storm uevent to be read", 60*time.Second, func() bool { return w.stats.Uevents.Load()-before >= storm })
	// The last batch is handled within stormFactor settle periods.
	waitFor(t, "the storm's last re-read", 30*time.Second, func() bool {
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
	states := instanceStates(t, m)
	if len(states) != len(ids) {
		t.Fatalf("records %v, want %d", states, len(ids))
	}
	for _, id := range ids {
		if states[id] != store.StateReady {
			t.Fatalf("instance %s is %s after the storm", id, states[id])
		}
	}
}
