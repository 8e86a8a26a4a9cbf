package health

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/uevent"
)

// fakeManager is a Manager over a fixed inventory that records the marks
// the watcher set, as text.
type fakeManager struct {
	inv gpu.Inventory

	mu     sync.Mutex
	failed map[string]manager.GPUFault
	marks  []string
}

func (f *fakeManager) mark(uuid, why string, lost bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failed == nil {
		f.failed = map[string]manager.GPUFault{}
	}
	switch {
	case why == "":
		delete(f.failed, uuid)
		f.marks = append(f.marks, "cleared "+uuid)
	case lost:
		f.failed[uuid] = manager.GPUFault{Why: why, Lost: true}
		f.marks = append(f.marks, "lost "+uuid)
	default:
		f.failed[uuid] = manager.GPUFault{Why: why}
		f.marks = append(f.marks, "failed "+uuid)
	}
}

func (f *fakeManager) MarkGPUFailed(uuid, why string) { f.mark(uuid, why, false) }
func (f *fakeManager) MarkGPULost(uuid, why string)   { f.mark(uuid, why, true) }

func (f *fakeManager) FailedGPUs() map[string]manager.GPUFault {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]manager.GPUFault, len(f.failed))
	for k, v := range f.failed {
		out[k] = v
	}
	return out
}

func (f *fakeManager) Reconcile(context.Context) (manager.ReconcileReport, error) {
	return manager.ReconcileReport{}, nil
}
func (f *fakeManager) Refresh(context.Context) error { return nil }
func (f *fakeManager) Publish(manager.Event)         {}
func (f *fakeManager) Inventory() gpu.Inventory      { return f.inv }

func (f *fakeManager) GPUs() ([]manager.GPUView, error) {
	out := make([]manager.GPUView, len(f.inv.GPUs))
	for i, g := range f.inv.GPUs {
		out[i] = manager.GPUView{GPU: g, State: "ok"}
	}
	return out, nil
}

func (f *fakeManager) marked() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.marks, "; ")
}

// fakeSource is a uevent Source fed by the test.
type fakeSource struct {
	ch     chan any // uevent.Event or error
	closed chan struct{}
	once   sync.Once
}

func (f *fakeSource) Next(ctx context.Context) (uevent.Event, error) {
	select {
	case <-ctx.Done():
		return uevent.Event{}, ctx.Err()
	case <-f.closed:
		return uevent.Event{}, uevent.ErrClosed
	case x := <-f.ch:
		if err, ok := x.(error); ok {
			return uevent.Event{}, err
		}
		return x.(uevent.Event), nil
	}
}

func (f *fakeSource) Close() error { f.once.Do(func() { close(f.closed) }); return nil }

// TestFaultUeventClassification drives the watcher with kernel-style
// events (PCI_ID, bind/unbind) the simulator does not emit, and with lost
// events, and checks what each batch asks for.
func TestFaultUeventClassification(t *testing.T) {
	const (
		uuid = "GPU-11111111-2222-3333-4444-555555555555"
		vf   = "0000:61:00.4"
	)
	// The time-sliced H100 of the simulated host, with one VF.
	inv := gpu.Inventory{GPUs: []gpu.GPU{{UUID: uuid, PCI: sim.DefaultH100TS, VGPU: gpu.VGPU{TotalVFs: 16, NumVFs: 1, VFs: []gpu.VF{{PCI: vf}}}}}}
	pf := "/devices/pci0000:60/0000:60:01.1/" + sim.DefaultH100TS
	tests := []struct {
		name  string
		feed  []any
		want  resync
		fails int64
		marks string
	}{
		{name: "other-vendor", feed: []any{uevent.Event{Action: uevent.Add, DevPath: "/devices/pci0000:00/0000:00:1f.3", Subsystem: "pci", Env: map[string]string{"PCI_ID": "8086:A0A3"}}}, want: noResync},
		{name: "other-subsystem", feed: []any{uevent.Event{Action: uevent.Remove, DevPath: "/devices/virtual/net/veth0", Subsystem: "net"}}, want: noResync},
		{name: "vf-type-set", feed: []any{uevent.Event{Action: uevent.Change, DevPath: "/x/" + vf, Subsystem: "pci", Env: map[string]string{"NVIDIA_VGPU_TYPE": "893"}}}, want: refresh},
		{name: "vf-unbound", feed: []any{uevent.Event{Action: uevent.Unbind, DevPath: "/x/" + vf, Subsystem: "pci"}}, want: reconcile},
		{name: "new-nvidia-function", feed: []any{uevent.Event{Action: uevent.Add, DevPath: "/x/0000:c1:00.0", Subsystem: "pci", Env: map[string]string{"PCI_ID": "10de:2330"}}}, want: reconcile},
		{name: "mdev-added", feed: []any{uevent.Event{Action: uevent.Add, DevPath: "/x/" + sim.DefaultA10 + "/u", Subsystem: "mdev"}}, want: refresh},
		{name: "events-lost", feed: []any{uevent.ErrOverflow}, want: reconcile},
		{name: "gpu-removed", feed: []any{uevent.Event{Action: uevent.Remove, DevPath: pf, Subsystem: "pci", Env: map[string]string{"PCI_ID": "10DE:2330"}}}, want: reconcile, fails: 1, marks: "lost " + uuid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := &fakeSource{ch: make(chan any), closed: make(chan struct{})}
			m := &fakeManager{inv: inv}
			w := New(Config{Manager: m, Settings: testSettings})
			// The worker is not started; the test plays it, and inspects
			// the batch instead of running it.
			w.uev = make(chan uevent.Event, 16)
			w.overflow = make(chan struct{}, 1)
			w.failed, w.index, w.reasons = map[string]*failure{}, map[string]devRef{}, map[string]int{}
			w.reindex()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); w.readUevents(ctx, src) }()
			for _, x := range tt.feed {
				src.ch <- x
			}
			testenv.WaitFor(t, "the reader to hand every event on", 5*time.Second, func() bool {
				return w.stats.Uevents.Load()+w.stats.Overflows.Load() == int64(len(tt.feed))
			})
			// Hand the reader's output to the worker's handlers.
			cancel()
			<-done
			for len(w.uev) > 0 {
				w.onUevent(<-w.uev)
			}
			if len(w.overflow) > 0 {
				<-w.overflow
				w.ask(reconcile, "uevents lost")
			}
			if w.want != tt.want || w.stats.Failures.Load() != tt.fails {
				t.Fatalf("batch wants %v (%v), failures %d; want %v, %d", w.want, w.reasons, w.stats.Failures.Load(), tt.want, tt.fails)
			}
			if got := m.marked(); got != tt.marks {
				t.Fatalf("manager marks %q, want %q", got, tt.marks)
			}
		})
	}
}

// TestSettleWindow: a batch is re-read once it has been quiet for
// UeventSettle, and a storm no later than stormFactor settle periods after
// its first event.
func TestSettleWindow(t *testing.T) {
	const settle = 100 * time.Millisecond
	start := time.Unix(1_700_000_000, 0)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tests := []struct {
		name   string
		events []time.Duration // when each event came, after start
		now    time.Duration
		want   time.Duration
	}{
		{name: "one-event", events: []time.Duration{0}, now: 0, want: settle},
		{name: "part-of-the-quiet-gone", events: []time.Duration{0}, now: ms(30), want: ms(70)},
		{name: "a-later-event-restarts-the-quiet", events: []time.Duration{0, ms(90)}, now: ms(90), want: settle},
		{name: "quiet-over", events: []time.Duration{0}, now: ms(500), want: 0},
		{name: "storm-capped", events: stormEvents(ms(50), ms(950)), now: ms(950), want: ms(50)},
		{name: "storm-past-the-cap", events: stormEvents(ms(50), ms(1200)), now: ms(1200), want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := start
			w := New(Config{
				Manager:  &fakeManager{},
				Settings: func() Settings { return Settings{UeventSettle: settle} },
				Now:      func() time.Time { return now },
			})
			w.reasons = map[string]int{}
			if _, ok := w.settleIn(); ok {
				t.Fatal("a re-read is due with no batch")
			}
			for _, at := range tt.events {
				now = start.Add(at)
				w.ask(refresh, "event")
			}
			now = start.Add(tt.now)
			got, ok := w.settleIn()
			if !ok || got != tt.want {
				t.Fatalf("re-read in %v (batch %v), want %v", got, ok, tt.want)
			}
		})
	}
}

// stormEvents are events every gap from 0 to last.
func stormEvents(gap, last time.Duration) []time.Duration {
	var out []time.Duration
	for at := time.Duration(0); at <= last; at += gap {
		out = append(out, at)
	}
	return out
}
