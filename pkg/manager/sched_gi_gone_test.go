package manager_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// giPins is the GPU-instance pins the store holds for the RTX PRO 6000.
func giPins(t *testing.T, e *env) []store.GPUInstanceScheduler {
	t.Helper()
	g, err := e.m.GPU(rtxPro)
	if err != nil {
		t.Fatal(err)
	}
	var st store.GPU
	if err := e.db.View(func(tx *store.Tx) (err error) { st, err = tx.GPU(g.UUID); return err }); err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	return st.GPUInstanceSchedulers
}

// droppedEvent waits for the event that says a pin was dropped and why.
func droppedEvent(t *testing.T, events <-chan manager.Event, why string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.Kind == manager.EventPolicySwitched && ev.Op == manager.SchedAdaptive && strings.Contains(ev.Detail, "scheduler pin") && strings.Contains(ev.Detail, why) {
				return
			}
		case <-deadline:
			t.Fatalf("no event says a pin was dropped: %s", why)
		}
	}
}

// foreignGone pins the scheduler of a GPU instance made by hand on the
// RTX PRO 6000 and destroys that GPU instance by hand: the pin is left
// without its GPU instance, shown with GPU instance -1 and the id it had.
func foreignGone(t *testing.T, e *env) int {
	t.Helper()
	ctx := context.Background()
	id, err := e.sim.CreateGPUInstance(rtxPro, 10) // 1g.24gb+gfx
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.SetGPUInstanceScheduler(ctx, rtxPro, id, manager.SchedulerRequest{Policy: "equal_share"}); err != nil {
		t.Fatalf("pin a GPU instance made by hand: %v", err)
	}
	if err := e.sim.DestroyGPUInstance(rtxPro, id); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := e.m.GPU(rtxPro)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.GPUInstanceSchedulers) != 1 || g.GPUInstanceSchedulers[0].GPUInstance != -1 || g.GPUInstanceSchedulers[0].LastGPUInstance != id || !g.GPUInstanceSchedulers[0].Pending {
		t.Fatalf("the pin of GPU instance %d, gone: %+v", id, g.GPUInstanceSchedulers)
	}
	return id
}

// TestGPUInstancePinDroppedWithItsGPUInstance: the destroy that takes a
// GPU instance away drops its pin, with an event; a GPU instance made
// again at the placement is not pinned. A destroy that leaves the GPU
// instance to a sharer keeps it.
func TestGPUInstancePinDroppedWithItsGPUInstance(t *testing.T) {
	e := newEnv(t, rtxProSpec())
	e.tenant("acme", unlimited())
	ctx := context.Background()
	r := e.mustCreate("acme", "RTX Pro 6000 Blackwell DC-1-6Q", rtxPro)
	if _, err := e.m.SetGPUInstanceScheduler(ctx, rtxPro, r.GIID, manager.SchedulerRequest{Policy: "equal_share", Timeslice: 5 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if p := giPins(t, e); len(p) != 1 || p[0].GPUInstance == nil || *p[0].GPUInstance != r.GIID {
		t.Fatalf("pin recorded as %+v, want GPU instance %d", p, r.GIID)
	}
	// A second vGPU in the same GPU instance: destroying one leaves the
	// GPU instance, and its pin, to the other.
	r2 := e.mustCreate("acme", "RTX Pro 6000 Blackwell DC-1-6Q", rtxPro)
	if r2.GIID == r.GIID {
		if err := e.m.Destroy(ctx, r2.UUID, manager.DestroyOptions{}); err != nil {
			t.Fatal(err)
		}
		if p := giPins(t, e); len(p) != 1 {
			t.Fatalf("destroying a sharer dropped the pin: %+v", p)
		}
	} else if err := e.m.Destroy(ctx, r2.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}

	events, stop := e.m.Subscribe()
	defer stop()
	if err := e.m.Destroy(ctx, r.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	droppedEvent(t, events, "destroyed with instance "+r.UUID)
	if p := giPins(t, e); len(p) != 0 {
		t.Fatalf("pins left after the GPU instance went: %+v", p)
	}
	g, _ := e.m.GPU(rtxPro)
	if len(g.GPUInstanceSchedulers) != 0 {
		t.Fatalf("GPU view after the destroy: %+v", g.GPUInstanceSchedulers)
	}
	r3 := e.mustCreate("acme", "RTX Pro 6000 Blackwell DC-1-6Q", rtxPro)
	e.m.RetryGPUInstanceSchedulers(ctx)
	if s, _ := e.host.NVML.GPUInstanceScheduler(ctx, g.UUID, r3.GIID); s.Policy != gpu.SchedBestEffort {
		t.Fatalf("a new GPU instance at the placement got the dropped pin: %+v", s)
	}
	assertConsistent(t, e)
}

// TestGPUInstancePinDroppedWhenGone: a pin whose GPU instance went
// behind vgpud's back is dropped by the id that GPU instance last had;
// an id no GPU instance and no pin has is NotFound and changes nothing.
func TestGPUInstancePinDroppedWhenGone(t *testing.T) {
	e := newEnv(t, rtxProSpec())
	ctx := context.Background()
	id := foreignGone(t, e)

	if _, err := e.m.SetGPUInstanceScheduler(ctx, rtxPro, id+20, manager.SchedulerRequest{Mode: manager.SchedAdaptive}); !errors.Is(err, manager.ErrNotFound) {
		t.Fatalf("drop the pin of GPU instance %d, never there: %v, want NotFound", id+20, err)
	}
	if p := giPins(t, e); len(p) != 1 {
		t.Fatalf("a refused drop changed the pins: %+v", p)
	}
	events, stop := e.m.Subscribe()
	defer stop()
	v, err := e.m.SetGPUInstanceScheduler(ctx, rtxPro, id, manager.SchedulerRequest{Mode: manager.SchedAdaptive})
	if err != nil || v.Mode != manager.SchedAdaptive {
		t.Fatalf("drop the pin of GPU instance %d, gone: %+v, %v", id, v, err)
	}
	droppedEvent(t, events, "its GPU instance is gone")
	if p := giPins(t, e); len(p) != 0 {
		t.Fatalf("pins left: %+v", p)
	}
	g, _ := e.m.GPU(rtxPro)
	if len(g.GPUInstanceSchedulers) != 0 {
		t.Fatalf("GPU view after the drop: %+v", g.GPUInstanceSchedulers)
	}
}

// TestGPUInstancePinsDroppedWithMIGOff: MIG turned off by vgpud drops
// every GPU-instance pin of the GPU, with an event; MIG on again brings
// none back.
func TestGPUInstancePinsDroppedWithMIGOff(t *testing.T) {
	e := newEnv(t, rtxProSpec())
	ctx := context.Background()
	foreignGone(t, e)
	events, stop := e.m.Subscribe()
	defer stop()
	if err := e.m.SetMIGMode(ctx, rtxPro, false); err != nil {
		t.Fatal(err)
	}
	droppedEvent(t, events, "MIG was turned off")
	if p := giPins(t, e); len(p) != 0 {
		t.Fatalf("pins left after MIG off: %+v", p)
	}
	if err := e.m.SetMIGMode(ctx, rtxPro, true); err != nil {
		t.Fatal(err)
	}
	g, _ := e.m.GPU(rtxPro)
	if len(g.GPUInstanceSchedulers) != 0 {
		t.Fatalf("GPU view after MIG off and on: %+v", g.GPUInstanceSchedulers)
	}
}
