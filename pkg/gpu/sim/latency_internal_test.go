package sim

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// gate is a sleep that blocks until released and counts the calls that
// are inside it at once.
type gate struct {
	in      atomic.Int32
	most    atomic.Int32
	entered chan time.Duration
	release chan struct{}
}

func newGate() *gate {
	return &gate{entered: make(chan time.Duration, 16), release: make(chan struct{})}
}

func (g *gate) sleep(d time.Duration) {
	n := g.in.Add(1)
	for {
		m := g.most.Load()
		if n <= m || g.most.CompareAndSwap(m, n) {
			break
		}
	}
	g.entered <- d
	<-g.release
	g.in.Add(-1)
}

// vfTypeWrite sets the nth VF of the built-in host's GPU pf to a type of
// its model.
func vfTypeWrite(t *testing.T, h *Host, pf string, n int) func() error {
	t.Helper()
	typ := map[string]string{DefaultH100TS: "H100XM-10C", DefaultL4: "L4-4Q"}[pf]
	var id int
	vf := ""
	_ = h.view(func(st *state) error {
		g := st.gpu(pf)
		vt, _ := g.model.VGPUTypeByName(typ)
		id, vf = vt.ID, g.VFs[n].PCI
		return nil
	})
	return func() error {
		return h.FS().WriteFile("bus/pci/devices/"+vf+"/nvidia/current_vgpu_type", []byte(strconv.Itoa(id)))
	}
}

// Timed calls on different GPUs overlap; on one GPU they take turns, and
// every call takes its class's figure.
func TestLatencySerialisesPerGPU(t *testing.T) {
	h := openDefault(t)
	g := newGate()
	h.sleep = g.sleep
	if err := h.SetLatency(Latency{VGPUType: "150ms", MdevCreate: "40ms"}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	run := func(fn func() error) {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- fn() }()
	}
	// Two GPUs: both calls are in the driver at once.
	run(vfTypeWrite(t, h, DefaultH100TS, 0))
	run(vfTypeWrite(t, h, DefaultL4, 0))
	for i := 0; i < 2; i++ {
		if d := <-g.entered; d != 150*time.Millisecond {
			t.Fatalf("a current_vgpu_type write took %v, want 150ms", d)
		}
	}
	if n := g.in.Load(); n != 2 {
		t.Fatalf("%d calls in the driver, want the two GPUs' calls at once", n)
	}
	g.release <- struct{}{}
	g.release <- struct{}{}
	wg.Wait()
	// One GPU: the second call waits until the first is done.
	g.most.Store(0)
	run(vfTypeWrite(t, h, DefaultL4, 1))
	<-g.entered
	run(vfTypeWrite(t, h, DefaultL4, 2))
	select {
	case <-g.entered:
		t.Fatal("a second call on the same GPU entered the driver while the first was in it")
	case <-time.After(100 * time.Millisecond):
	}
	g.release <- struct{}{}
	<-g.entered
	g.release <- struct{}{}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if m := g.most.Load(); m != 1 {
		t.Fatalf("%d calls on one GPU in the driver at once, want 1", m)
	}
}

// Untimed operations (reads, classes without a figure) never sleep; the
// setting is refused when out of range and survives a reopen.
func TestLatencySettings(t *testing.T) {
	h := openDefault(t)
	h.sleep = func(d time.Duration) { t.Fatalf("slept %v with no latency configured for the call", d) }
	if err := h.SetLatency(Latency{MIGMode: "1s"}); err != nil {
		t.Fatal(err)
	}
	if err := vfTypeWrite(t, h, DefaultL4, 0)(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Summary(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []Latency{{GPUInstanceCreate: "-1s"}, {MdevRemove: "11s"}, {Jitter: -0.5}, {VGPUType: "x"}} {
		if err := h.SetLatency(bad); !errors.Is(err, ErrBadSpec) {
			t.Errorf("SetLatency(%+v) = %v, want ErrBadSpec", bad, err)
		}
	}
	if l, _ := h.LatencySettings(); l != (Latency{MIGMode: "1s"}) {
		t.Fatalf("a refused setting changed the latencies: %+v", l)
	}
	h2, err := Open(h.Dir(), nil, h.cat, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	if l, _ := h2.LatencySettings(); l.MIGMode != "1s" {
		t.Fatalf("latency after reopen: %+v", l)
	}
	if err := h.SetLatency(Latency{}); err != nil {
		t.Fatal(err)
	}
	if l, _ := h.LatencySettings(); l != (Latency{}) {
		t.Fatalf("latency after turning it off: %+v", l)
	}
}

// Jitter spreads a figure within its bounds.
func TestLatencyJitter(t *testing.T) {
	m := newLatencyModel(&Latency{GPUInstanceCreate: "100ms", Jitter: 0.2})
	lo, hi := time.Hour, time.Duration(0)
	for i := 0; i < 200; i++ {
		d := m.of(latGICreate)
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo < 80*time.Millisecond || hi > 120*time.Millisecond || hi-lo < 10*time.Millisecond {
		t.Fatalf("jittered figures span %v..%v, want within 80..120ms and spread", lo, hi)
	}
	if d := m.of(latCICreate); d != 0 {
		t.Fatalf("a class without a figure took %v", d)
	}
}
