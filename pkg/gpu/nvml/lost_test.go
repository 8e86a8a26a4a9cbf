package nvml_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
)

// An Init that fails past ReopenTimeout leaves NVML uninitialized; the
// calls meanwhile get the driver's error at once, and once Init works
// again the next call initializes NVML and runs with the new session's
// handle, without another reset.
func TestResetInitRecoversAtEntry(t *testing.T) {
	rig := newResetRig(t, nvmlb.Options{ReopenTimeout: 100 * time.Millisecond})
	ctx := ctxFor(t, 10*time.Second)
	p := rig.b.Probe(resetUUID)
	if n, err := p.ActiveVGPUCount(ctx); err != nil || n != 1 {
		t.Fatalf("before the reset: %d vGPUs, %v", n, err)
	}
	if err := rig.r.ReleaseGPU(ctx, resetUUID); err != nil {
		t.Fatal(err)
	}
	rig.mu.Lock()
	rig.initErr = gonvml.ERROR_DRIVER_NOT_LOADED
	rig.mu.Unlock()
	if err := rig.r.ReopenGPU(ctx, resetUUID); err == nil {
		t.Fatalf("reopen with a failing Init: %v", err)
	}
	start := time.Now()
	if _, err := p.ActiveVGPUCount(ctx); !errors.Is(err, gpu.ErrDriverNotLoaded) {
		t.Fatalf("a call while Init fails: %v (want the driver's error)", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("a call while Init fails took %v", d)
	}
	rig.mu.Lock()
	rig.initErr = gonvml.SUCCESS
	rig.mu.Unlock()
	var n int
	var err error
	for {
		if n, err = p.ActiveVGPUCount(ctx); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || n != 2 {
		t.Fatalf("after Init works again: %d vGPUs, %v (want the new session's 2)", n, err)
	}
	got := rig.j.list()
	if slices.ContainsFunc(got, func(op string) bool { return strings.HasPrefix(op, "write") }) || slices.Index(got, "handle 2") < 0 {
		t.Errorf("journal %q: want NVML initialized again without a reset", got)
	}
	// A second reset works from the recovered session.
	if err, rerr := rig.steps(ctx); err != nil || rerr != nil {
		t.Fatalf("the next reset: %v; reopen: %v", err, rerr)
	}
	if n, err := p.ActiveVGPUCount(ctx); err != nil || n != 3 {
		t.Fatalf("after the next reset: %d vGPUs, %v (want session 3's)", n, err)
	}
}

// A Shutdown that finds NVML uninitialized (an earlier reset could not
// initialize it again) lets the release go on.
func TestResetShutdownUninitialized(t *testing.T) {
	rig := newResetRig(t, nvmlb.Options{})
	ctx := ctxFor(t, 10*time.Second)
	if _, err := rig.b.Probe(resetUUID).ActiveVGPUCount(ctx); err != nil {
		t.Fatal(err)
	}
	rig.lib.ShutdownFunc = func() gonvml.Return {
		rig.mu.Lock()
		defer rig.mu.Unlock()
		rig.j.add("Shutdown")
		rig.up = false
		return gonvml.ERROR_UNINITIALIZED
	}
	if err, rerr := rig.steps(ctx); err != nil || rerr != nil {
		t.Fatalf("reset: %v; reopen: %v", err, rerr)
	}
	if n, err := rig.b.Probe(resetUUID).ActiveVGPUCount(ctx); err != nil || n != 2 {
		t.Fatalf("after the reset: %d vGPUs, %v (want the new session's 2)", n, err)
	}
	if !slices.Contains(rig.j.list(), "write reset 1") {
		t.Errorf("journal %q: no reset", rig.j.list())
	}
}

// A second release for the same GPU while the first still waits for a
// call in flight waits for it too: it must not shut NVML down under it.
func TestResetSecondReleaseWaitsForDrain(t *testing.T) {
	rig := newResetRig(t, nvmlb.Options{})
	ctx := ctxFor(t, 10*time.Second)
	// Keep the PCI address, so that neither release enters the gate.
	_, _ = rig.r.Holders(ctx, resetUUID)
	block, read := rig.heldRead(ctx)
	first, second := make(chan error, 1), make(chan error, 1)
	go func() { first <- rig.r.ReleaseGPU(ctx, resetUUID) }()
	time.Sleep(20 * time.Millisecond)
	go func() { second <- rig.r.ReleaseGPU(ctx, resetUUID) }()
	select {
	case err := <-second:
		t.Fatalf("the second release returned (%v) under a call in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(block)
	if err := <-read; err != nil {
		t.Fatalf("the call in flight: %v", err)
	}
	for _, ch := range []chan error{first, second} {
		if err := <-ch; err != nil {
			t.Fatalf("release: %v", err)
		}
	}
	got := rig.j.list()
	if i, k := slices.Index(got, "GetActiveVgpus 1"), slices.Index(got, "Shutdown"); i < 0 || k < i {
		t.Errorf("journal %q: the call in flight must end before Shutdown", got)
	}
	if err := rig.r.ReopenGPU(ctx, resetUUID); err != nil {
		t.Fatal(err)
	}
}

// A Shutdown that outruns its deadline leaves whether NVML is up
// unknown: the next call finds out once it returned, and initializes NVML
// again only when it is down.
func TestResetShutdownTimeoutRecovers(t *testing.T) {
	rig := newResetRig(t, nvmlb.Options{})
	ctx := ctxFor(t, 10*time.Second)
	p := rig.b.Probe(resetUUID)
	if _, err := p.ActiveVGPUCount(ctx); err != nil {
		t.Fatal(err)
	}
	stuck := make(chan struct{})
	rig.lib.ShutdownFunc = func() gonvml.Return {
		<-stuck
		rig.mu.Lock()
		defer rig.mu.Unlock()
		rig.j.add("Shutdown")
		rig.up = false
		return gonvml.SUCCESS
	}
	rig.lib.DeviceGetCountFunc = func() (int, gonvml.Return) {
		rig.mu.Lock()
		defer rig.mu.Unlock()
		if !rig.up {
			return 0, gonvml.ERROR_UNINITIALIZED
		}
		return 1, gonvml.SUCCESS
	}
	if err := rig.r.ReleaseGPU(ctxFor(t, 200*time.Millisecond), resetUUID); !errors.Is(err, gpu.ErrTimeout) {
		t.Fatalf("release with a stuck Shutdown: %v", err)
	}
	if _, err := p.ActiveVGPUCount(ctx); !errors.Is(err, gpu.ErrDriverNotLoaded) {
		t.Fatalf("a call while the Shutdown runs: %v (want the driver's error)", err)
	}
	close(stuck)
	var n int
	var err error
	for {
		if n, err = p.ActiveVGPUCount(ctx); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || n != 2 {
		t.Fatalf("after the Shutdown returned: %d vGPUs, %v (want the new session's 2)", n, err)
	}
}

// Init while a reset left NVML uninitialized initializes it once: the
// gate's entry does, and Init does not count a second session.
func TestInitAfterLostSessionInitializesOnce(t *testing.T) {
	rig := newResetRig(t, nvmlb.Options{ReopenTimeout: 50 * time.Millisecond})
	ctx := ctxFor(t, 10*time.Second)
	if err := rig.r.ReleaseGPU(ctx, resetUUID); err != nil {
		t.Fatal(err)
	}
	rig.mu.Lock()
	rig.initErr = gonvml.ERROR_DRIVER_NOT_LOADED
	rig.mu.Unlock()
	if err := rig.r.ReopenGPU(ctx, resetUUID); err == nil {
		t.Fatal("reopen with a failing Init succeeded")
	}
	rig.mu.Lock()
	rig.initErr = gonvml.SUCCESS
	rig.mu.Unlock()
	before := len(rig.j.list())
	if err := rig.b.Init(ctx); err != nil {
		t.Fatal(err)
	}
	got := rig.j.list()[before:]
	if n := len(slices.DeleteFunc(slices.Clone(got), func(op string) bool { return op != "Init" })); n != 1 {
		t.Errorf("journal %q: NVML initialized %d times (want once)", got, n)
	}
}
