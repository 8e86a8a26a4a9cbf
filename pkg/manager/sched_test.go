package manager_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
)

// The vGPU scheduler pinned by an operator: bad requests change nothing,
// the driver's refusal while a VM runs leaves the setting pending until
// the VM stops, and a reboot's reset is undone by the start-up reconcile.
func TestGPUSchedulerPinnedPendingAndReboot(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	ctx := context.Background()
	g0, err := e.m.GPU(sim.DefaultL4)
	if err != nil {
		t.Fatal(err)
	}
	l4 := g0.UUID
	for _, bad := range []manager.SchedulerRequest{
		{},
		{Policy: "round_robin"},
		{Mode: "sometimes", Policy: "fixed_share"},
		{Mode: manager.SchedAdaptive, Policy: "fixed_share"},
		{Policy: "fixed_share", Timeslice: -time.Millisecond},
		{Policy: "fixed_share", Timeslice: time.Hour}, // outside the GPU's range
	} {
		if _, err := e.m.SetGPUScheduler(ctx, sim.DefaultL4, bad); !errors.Is(err, manager.ErrInvalidArgument) {
			t.Errorf("SetGPUScheduler(%+v): %v, want ErrInvalidArgument", bad, err)
		}
	}
	if _, err := e.m.SetGPUScheduler(ctx, "0000:ff:00.0", manager.SchedulerRequest{Policy: "fixed_share"}); !errors.Is(err, manager.ErrNotFound) {
		t.Errorf("unknown GPU: %v", err)
	}
	if _, err := e.m.SetGPUScheduler(ctx, sim.DefaultH100MIG, manager.SchedulerRequest{Policy: "fixed_share"}); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Errorf("MIG GPU: %v, want ErrInvalidArgument", err)
	}
	if g, _ := e.m.GPU(sim.DefaultL4); g.Scheduler == nil || g.Scheduler.Mode != manager.SchedAdaptive {
		t.Fatalf("after refused requests the GPU shows %+v, want adaptive", g.Scheduler)
	}

	v, err := e.m.SetGPUScheduler(ctx, sim.DefaultL4, manager.SchedulerRequest{Policy: "equal-share", Timeslice: 4 * time.Millisecond})
	if err != nil || v.Mode != manager.SchedPinned || v.Policy != "equal_share" || v.Pending {
		t.Fatalf("pin on an idle GPU: %+v, %v", v, err)
	}
	if s, err := e.host.NVML.VGPUScheduler(ctx, l4); err != nil || s.Policy != "equal_share" || s.Timeslice != 4*time.Millisecond {
		t.Fatalf("driver holds %+v, %v", s, err)
	}

	// A VM runs a vGPU: the driver refuses; the setting is kept, pending.
	r := e.mustCreate("acme", "L4-4Q", sim.DefaultL4)
	dev := r.MdevUUID
	if dev == "" {
		dev = r.VF
	}
	if err := e.sim.OpenDevice(dev, "0b7c1b6e-8d5f-4c4e-9a47-6f7d3f0c2a11", "vm1"); err != nil {
		t.Fatal(err)
	}
	v, err = e.m.SetGPUScheduler(ctx, sim.DefaultL4, manager.SchedulerRequest{Policy: "fixed_share"})
	if err != nil || !v.Pending || v.Policy != "fixed_share" {
		t.Fatalf("pin while a VM runs: %+v, %v (want pending)", v, err)
	}
	if s, _ := e.host.NVML.VGPUScheduler(ctx, l4); s.Policy != "equal_share" {
		t.Fatalf("driver changed under a running VM: %+v", s)
	}
	if g, _ := e.m.GPU(sim.DefaultL4); g.Scheduler == nil || !g.Scheduler.Pending {
		t.Fatalf("GPU view does not show the pending setting: %+v", g.Scheduler)
	}
	e.m.RetrySchedulers(ctx)
	if g, _ := e.m.GPU(sim.DefaultL4); !g.Scheduler.Pending {
		t.Fatal("retry set the scheduler while the VM runs")
	}
	if err := e.sim.CloseDevice(dev); err != nil {
		t.Fatal(err)
	}
	e.m.RetrySchedulers(ctx)
	if s, _ := e.host.NVML.VGPUScheduler(ctx, l4); s.Policy != "fixed_share" {
		t.Fatalf("after the VM stopped the driver holds %+v", s)
	}
	if g, _ := e.m.GPU(sim.DefaultL4); g.Scheduler.Pending {
		t.Fatal("still pending after it was set")
	}

	// A reboot resets the scheduler; the start-up reconcile sets it again.
	if err := e.sim.Reboot(); err != nil {
		t.Fatal(err)
	}
	e.restart()
	if s, _ := e.host.NVML.VGPUScheduler(ctx, l4); s.Policy != "fixed_share" {
		t.Fatalf("after a reboot the driver holds %+v", s)
	}
	if g, _ := e.m.GPU(sim.DefaultL4); g.Scheduler == nil || g.Scheduler.Mode != manager.SchedPinned || g.Scheduler.Pending {
		t.Fatalf("after a reboot the GPU shows %+v", g.Scheduler)
	}

	// Handed back to the share loop: the record is dropped, a reboot
	// leaves the driver's default.
	if v, err := e.m.SetGPUScheduler(ctx, sim.DefaultL4, manager.SchedulerRequest{Mode: manager.SchedAdaptive}); err != nil || v.Mode != manager.SchedAdaptive {
		t.Fatalf("adaptive: %+v, %v", v, err)
	}
	if err := e.sim.Reboot(); err != nil {
		t.Fatal(err)
	}
	e.restart()
	if s, _ := e.host.NVML.VGPUScheduler(ctx, l4); s.Policy != "best_effort" {
		t.Fatalf("adaptive GPU after a reboot: %+v", s)
	}
	assertConsistent(t, e)
}

// The share loop's changes go through UnlessPinned: it runs them while the
// GPU is adaptive and never once a pin is recorded, and a change racing a
// pin lands before the pin's own driver call or not at all, so the driver
// holds the pin when SetGPUScheduler returns and afterwards.
func TestUnlessPinnedHoldsThePin(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	g0, err := e.m.GPU(sim.DefaultL4)
	if err != nil {
		t.Fatal(err)
	}
	l4 := g0.UUID
	loopSet := func() error {
		return e.host.NVML.SetVGPUScheduler(ctx, l4, gpu.VGPUScheduler{Policy: gpu.SchedBestEffort})
	}
	if ran, err := e.m.UnlessPinned(ctx, l4, loopSet); !ran || err != nil {
		t.Fatalf("adaptive GPU: ran %v, %v; want the change run", ran, err)
	}
	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				done <- n
				return
			default:
			}
			if ran, err := e.m.UnlessPinned(ctx, l4, loopSet); err != nil {
				t.Errorf("UnlessPinned: %v", err)
			} else if ran {
				n++
			}
		}
	}()
	if _, err := e.m.SetGPUScheduler(ctx, sim.DefaultL4, manager.SchedulerRequest{Policy: gpu.SchedEqualShare, Timeslice: 5 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	// Every change the loop tries from now on is refused.
	for range 50 {
		if ran, err := e.m.UnlessPinned(ctx, l4, loopSet); ran || err != nil {
			t.Fatalf("pinned GPU: ran %v, %v; want refused", ran, err)
		}
	}
	close(stop)
	<-done
	if s, err := e.host.NVML.VGPUScheduler(ctx, l4); err != nil || s.Policy != gpu.SchedEqualShare || s.Timeslice != 5*time.Millisecond {
		t.Fatalf("driver holds %+v, %v; want the pin (equal_share, 5ms)", s, err)
	}
	if _, err := e.m.SetGPUScheduler(ctx, sim.DefaultL4, manager.SchedulerRequest{Mode: manager.SchedAdaptive}); err != nil {
		t.Fatal(err)
	}
	if ran, err := e.m.UnlessPinned(ctx, l4, loopSet); !ran || err != nil {
		t.Fatalf("handed back to the share loop: ran %v, %v", ran, err)
	}
}

// Time slices: both ends of the documented range and any whole number of
// microseconds between are set as they are, and the GPU shows what the
// driver holds; a slice outside the range, or finer than a microsecond,
// is refused by name (InvalidArgument) before the driver is asked, and
// changes nothing.
func TestGPUSchedulerTimeslices(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	g0, err := e.m.GPU(sim.DefaultL4)
	if err != nil {
		t.Fatal(err)
	}
	// The driver takes a slice as a frequency in whole Hz: it holds the
	// settable slice nearest to the one asked, inside the range.
	for _, c := range [][2]time.Duration{
		{gpu.MinTimeslice, gpu.MinTimeslice},
		{gpu.MaxTimeslice, time.Second / 34}, // 33 Hz would be 30.3 ms
		{6 * time.Millisecond, time.Second / 167},
		{1999 * time.Microsecond, 2 * time.Millisecond},
		{10 * time.Millisecond, 10 * time.Millisecond},
	} {
		ts, want := c[0], c[1]
		v, err := e.m.SetGPUScheduler(ctx, sim.DefaultL4, manager.SchedulerRequest{Policy: gpu.SchedEqualShare, Timeslice: ts})
		if err != nil || v.Pending {
			t.Fatalf("pin with a %v slice: %+v, %v", ts, v, err)
		}
		held, err := e.host.NVML.VGPUScheduler(ctx, g0.UUID)
		if err != nil || held.Timeslice != want || held.Policy != gpu.SchedEqualShare {
			t.Fatalf("pin with a %v slice: the driver holds %+v, %v; want %v", ts, held, err, want)
		}
		if v.Timeslice != held.Timeslice {
			t.Fatalf("pin with a %v slice: shown as %v, the driver holds %v", ts, v.Timeslice, held.Timeslice)
		}
		if g, _ := e.m.GPU(sim.DefaultL4); g.Scheduler == nil || g.Scheduler.Timeslice != held.Timeslice {
			t.Fatalf("GPU view after a %v slice: %+v", ts, g.Scheduler)
		}
	}
	for _, ts := range []time.Duration{time.Nanosecond, 1999999 * time.Nanosecond, gpu.MinTimeslice - time.Microsecond, gpu.MaxTimeslice + time.Microsecond, 2562047 * time.Hour} {
		_, err := e.m.SetGPUScheduler(ctx, sim.DefaultL4, manager.SchedulerRequest{Policy: gpu.SchedFixedShare, Timeslice: ts})
		if !errors.Is(err, manager.ErrInvalidArgument) {
			t.Fatalf("pin with a %v slice: %v, want InvalidArgument", ts, err)
		}
		if held, _ := e.host.NVML.VGPUScheduler(ctx, g0.UUID); held.Policy != gpu.SchedEqualShare || held.Timeslice != 10*time.Millisecond {
			t.Fatalf("a refused %v slice changed the driver: %+v", ts, held)
		}
	}
}

// A refused time slice is named once, in words an operator acts on.
func TestGPUSchedulerRefusalSaysItOnce(t *testing.T) {
	e := newEnv(t, nil)
	_, err := e.m.SetGPUScheduler(context.Background(), sim.DefaultL4, manager.SchedulerRequest{Policy: gpu.SchedFixedShare, Timeslice: time.Nanosecond})
	if !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("1ns: %v", err)
	}
	for _, text := range []string{err.Error(), manager.Message(err)} {
		if strings.Count(text, "time slice 1ns") != 1 || !strings.Contains(text, "1ms..30ms") {
			t.Errorf("refusal %q: want the slice named once, with the range", text)
		}
	}
}

// A pinned slice the driver holds rounded (6ms as 5.988023ms) counts as
// held, also when it was pinned while a VM ran (pending) and set once the
// VM stopped: a later pass (reconcile) does not ask the driver again, so
// a VM started since cannot turn the pin that holds into a pending one.
func TestPinnedRoundedSliceHolds(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	ctx := context.Background()
	r := e.mustCreate("acme", "L4-4Q", sim.DefaultL4)
	dev := r.MdevUUID
	if dev == "" {
		dev = r.VF
	}
	const vm = "0b7c1b6e-8d5f-4c4e-9a47-6f7d3f0c2a11"
	if err := e.sim.OpenDevice(dev, vm, "vm1"); err != nil {
		t.Fatal(err)
	}
	v, err := e.m.SetGPUScheduler(ctx, sim.DefaultL4, manager.SchedulerRequest{Policy: gpu.SchedFixedShare, Timeslice: 6 * time.Millisecond})
	if err != nil || !v.Pending || v.Timeslice != time.Second/167 {
		t.Fatalf("pin 6ms while a VM runs: %+v, %v; want pending, to be held as %v", v, err, time.Second/167)
	}
	if err := e.sim.CloseDevice(dev); err != nil {
		t.Fatal(err)
	}
	e.m.RetrySchedulers(ctx)
	if g, _ := e.m.GPU(sim.DefaultL4); g.Scheduler == nil || g.Scheduler.Pending {
		t.Fatalf("after the VM stopped: %+v, want the pin set", g.Scheduler)
	}
	if err := e.sim.OpenDevice(dev, vm, "vm1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if g, _ := e.m.GPU(sim.DefaultL4); g.Scheduler == nil || g.Scheduler.Pending || g.Scheduler.Timeslice != time.Second/167 {
		t.Fatalf("after a reconcile with a VM running: %+v, want the pin held, not pending", g.Scheduler)
	}
}
