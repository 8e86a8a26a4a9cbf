package share

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// fakeGPU answers the loop's reads with nothing to measure: a MIG GPU
// (scheduler NOT_SUPPORTED) or a time-sliced one running active vGPUs.
type fakeGPU struct {
	mig    bool
	active []VGPU
	// policies the scheduler offers (default: all three).
	policies []Policy
	// log is what SchedulerLog returns.
	log Log
	// sets counts SetSchedulerState calls.
	sets int
}

func (f *fakeGPU) SchedulerCapabilities(context.Context) (Caps, error) {
	if f.mig {
		return Caps{}, gpu.ErrNotSupported
	}
	if f.policies != nil {
		return Caps{Policies: f.policies}, nil
	}
	return Caps{Policies: []Policy{BestEffort, EqualShare, FixedShare}}, nil
}
func (f *fakeGPU) SchedulerState(context.Context) (State, error) {
	return State{Policy: BestEffort}, nil
}
func (f *fakeGPU) SetSchedulerState(context.Context, State) error { f.sets++; return nil }
func (f *fakeGPU) SchedulerLog(context.Context) (Log, error)      { return f.log, nil }
func (f *fakeGPU) ActiveVGPUs(context.Context) ([]VGPU, error)    { return f.active, nil }
func (f *fakeGPU) ActiveVGPUCount(context.Context) (int, error)   { return len(f.active), nil }
func (f *fakeGPU) VGPUUtilization(context.Context, uint64) ([]UtilSample, uint64, error) {
	return nil, 0, nil
}
func (f *fakeGPU) Clocks(context.Context) (Clocks, error)             { return Clocks{}, nil }
func (f *fakeGPU) Telemetry(context.Context, bool) (Telemetry, error) { return Telemetry{}, nil }
func (f *fakeGPU) MIGActivity(context.Context, []int) (map[int]MIGActivity, error) {
	return map[int]MIGActivity{}, nil
}
func (f *fakeGPU) MIGMemory(context.Context) (map[int][2]uint64, error) { return nil, nil }

type fakeDriver map[string]*fakeGPU

func (d fakeDriver) GPU(uuid string) GPUDriver { return d[uuid] }

// Run steps at every poll only while a GPU needs its scheduler log read;
// otherwise it sleeps to the window's end.
func TestNextStep(t *testing.T) {
	now := time.Unix(1000, 0)
	ts := &fakeGPU{}
	drv := fakeDriver{"GPU-mig": {mig: true}, "GPU-ts": ts}
	inv := Inventory{GPUs: []GPU{{UUID: "GPU-mig", MIG: true, State: "ok"}, {UUID: "GPU-ts", State: "ok"}}}
	l, err := New(SourceFunc(func(context.Context) (Inventory, error) { return inv, nil }), drv,
		Config{Mode: Observe, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	step := func(d time.Duration) time.Duration {
		t.Helper()
		now = now.Add(d)
		if err := l.Step(ctx); err != nil {
			t.Fatal(err)
		}
		return l.nextStep()
	}
	poll, window := l.cfg.Poll, l.cfg.Window
	// Before its first window a time-sliced GPU is read every poll.
	if got := step(0); got != poll {
		t.Fatalf("before the first window: next step in %v, want %v", got, poll)
	}
	for range 4 {
		step(poll)
	}
	// The window closed and found no vGPU running: both GPUs are read at
	// the next window only.
	if got := step(poll); got != window {
		t.Fatalf("MIG and idle GPUs: next step in %v, want the window %v", got, window)
	}
	if got := step(300 * time.Millisecond); got != window-300*time.Millisecond {
		t.Fatalf("mid-window: next step in %v, want the rest of the window", got)
	}
	// A VM event: the time-sliced GPU is read every poll until the window
	// says whether a vGPU runs.
	l.Kick()
	if got := step(0); got != poll {
		t.Fatalf("after a VM event: next step in %v, want %v", got, poll)
	}
	ts.active = []VGPU{{Handle: 1}}
	if got := step(window - 300*time.Millisecond); got != poll {
		t.Fatalf("with a running vGPU: next step in %v, want %v", got, poll)
	}
	ts.active = nil
	if got := step(window); got != window {
		t.Fatalf("once the vGPU stopped: next step in %v, want %v", got, window)
	}
}

// A wanted policy the GPU does not offer is counted every window and
// logged once.
func TestUnsupportedPolicyLoggedOnce(t *testing.T) {
	now := time.Unix(1000, 0)
	drv := fakeDriver{"GPU-ts": {policies: []Policy{BestEffort}}}
	inv := Inventory{GPUs: []GPU{{UUID: "GPU-ts", State: "ok"}},
		Instances: []Instance{{UUID: "v1", Tenant: "acme", Guaranteed: true, GPU: "GPU-ts", Kind: TimeSliced, GI: -1, ComputeMilli: 500}}}
	var logs bytes.Buffer
	l, err := New(SourceFunc(func(context.Context) (Inventory, error) { return inv, nil }), drv,
		Config{Mode: Static, Now: func() time.Time { return now }, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := l.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
		now = now.Add(l.cfg.Window)
	}
	g := l.Snapshot().GPUs[0]
	if n := g.Refusals[FixedShare]["unsupported_policy"]; n < 4 {
		t.Errorf("unsupported_policy refusals %d after 4 windows", n)
	}
	if n := strings.Count(logs.String(), "not offered by the GPU"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, logs.String())
	}
}

// Run time of runlists that are no running vGPU's handle is counted and,
// when nothing matches, the likely cause logged once.
func TestUnmatchedRunlists(t *testing.T) {
	now := time.Unix(1000, 0)
	ts := &fakeGPU{active: []VGPU{{Handle: 1, VMID: "vm-1"}}}
	drv := fakeDriver{"GPU-ts": ts}
	inv := Inventory{GPUs: []GPU{{UUID: "GPU-ts", State: "ok"}},
		Instances: []Instance{{UUID: "v1", Tenant: "acme", GPU: "GPU-ts", Kind: TimeSliced, GI: -1, VMUUID: "vm-1", ComputeMilli: 500}}}
	var logs bytes.Buffer
	l, err := New(SourceFunc(func(context.Context) (Inventory, error) { return inv, nil }), drv,
		Config{Mode: Observe, Now: func() time.Time { return now }, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	// A driver that numbers runlists otherwise than handles: runlist 7
	// runs 100 ms per poll.
	var total time.Duration
	for i := range 16 {
		total += 100 * time.Millisecond
		ts.log = Log{Entries: []LogEntry{{Time: int64(i + 1), Runlist: 7, Run: 100 * time.Millisecond, RunTotal: total}}}
		if err := l.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
		now = now.Add(l.cfg.Poll)
	}
	g := l.Snapshot().GPUs[0]
	// The first read is the baseline; polls 1..15 ran in the windows that
	// closed at polls 5, 10 and 15.
	if math.Abs(g.UnmatchedRunSeconds-1.5) > 1e-9 {
		t.Errorf("unmatched run %.3fs, want 1.5s", g.UnmatchedRunSeconds)
	}
	if n := strings.Count(logs.String(), "no runlist matches"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, logs.String())
	}
	if s := l.Snapshot().Instances[0]; s.Busy != 0 {
		t.Errorf("instance busy %.2f from unmatched runs", s.Busy)
	}
}

// A GPU an operator pinned is never switched: the static mode would set
// FIXED_SHARE for the guaranteed instance; once pinned is lifted it does.
func TestPinnedGPUNotSwitched(t *testing.T) {
	now := time.Unix(1000, 0)
	ts := &fakeGPU{}
	drv := fakeDriver{"GPU-ts": ts}
	inv := Inventory{GPUs: []GPU{{UUID: "GPU-ts", State: "ok", Pinned: true, PinnedPolicy: FixedShare}},
		Instances: []Instance{{UUID: "v1", Tenant: "acme", Guaranteed: true, GPU: "GPU-ts", Kind: TimeSliced, GI: -1, ComputeMilli: 500}}}
	l, err := New(SourceFunc(func(context.Context) (Inventory, error) { return inv, nil }), drv,
		Config{Mode: Static, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	steps := func() {
		for range 3 {
			if err := l.Step(context.Background()); err != nil {
				t.Fatal(err)
			}
			now = now.Add(l.cfg.Window)
		}
	}
	steps()
	if ts.sets != 0 {
		t.Fatalf("pinned GPU: %d scheduler changes, want none", ts.sets)
	}
	g := l.Snapshot().GPUs[0]
	if !g.Pinned || g.Desired != FixedShare || g.Pending != nil {
		t.Fatalf("pinned GPU in the snapshot: pinned %v, desired %s, pending %+v", g.Pinned, g.Desired, g.Pending)
	}
	inv.GPUs[0].PinnedPending = true
	steps()
	if g := l.Snapshot().GPUs[0]; g.Pending == nil || g.Pending.To != FixedShare || ts.sets != 0 {
		t.Fatalf("pinned setting pending: snapshot pending %+v, %d changes", g.Pending, ts.sets)
	}
	inv.GPUs[0].Pinned, inv.GPUs[0].PinnedPending = false, false
	steps()
	if ts.sets == 0 {
		t.Fatal("unpinned GPU under the static mode: no scheduler change")
	}
}

// Running vGPUs that match no instance (two of one type opened by a VM
// vgpud does not know) have their run time counted as unmatched, and each
// is logged once.
func TestUnmatchedRunningVGPUs(t *testing.T) {
	now := time.Unix(1000, 0)
	ts := &fakeGPU{active: []VGPU{{Handle: 1, VMID: "vm-x", TypeID: 5}, {Handle: 2, VMID: "vm-x", TypeID: 5}}}
	drv := fakeDriver{"GPU-ts": ts}
	inv := Inventory{GPUs: []GPU{{UUID: "GPU-ts", State: "ok"}},
		Instances: []Instance{
			{UUID: "v1", Tenant: "acme", GPU: "GPU-ts", Kind: TimeSliced, GI: -1, TypeID: 5, ComputeMilli: 250},
			{UUID: "v2", Tenant: "acme", GPU: "GPU-ts", Kind: TimeSliced, GI: -1, TypeID: 5, ComputeMilli: 250}}}
	var logs bytes.Buffer
	l, err := New(SourceFunc(func(context.Context) (Inventory, error) { return inv, nil }), drv,
		Config{Mode: Observe, Now: func() time.Time { return now }, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var t1, t2 time.Duration
	for i := range 16 {
		t1 += 50 * time.Millisecond
		t2 += 50 * time.Millisecond
		ts.log = Log{Entries: []LogEntry{
			{Time: int64(2*i + 1), Runlist: 1, Run: 50 * time.Millisecond, RunTotal: t1},
			{Time: int64(2*i + 2), Runlist: 2, Run: 50 * time.Millisecond, RunTotal: t2}}}
		if err := l.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
		now = now.Add(l.cfg.Poll)
	}
	g := l.Snapshot().GPUs[0]
	if math.Abs(g.UnmatchedRunSeconds-1.5) > 1e-9 {
		t.Errorf("unmatched run %.3fs, want 1.5s (two vGPUs, 100ms per poll, 15 polls)", g.UnmatchedRunSeconds)
	}
	if n := strings.Count(logs.String(), "running vGPU matches no instance"); n != 2 {
		t.Errorf("logged %d times, want once per vGPU:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "vm_uuid=vm-x") {
		t.Errorf("the log does not name the VM:\n%s", logs.String())
	}
}

// A pin the loop's inventory does not show yet (it is read once a window)
// is not overridden: the guard, which sees the pin, refuses the loop's
// change, and the loop gives its switch up instead of retrying it.
func TestPinNewerThanInventoryNotOverridden(t *testing.T) {
	now := time.Unix(1000, 0)
	ts := &fakeGPU{}
	drv := fakeDriver{"GPU-ts": ts}
	// The inventory still says adaptive; the static mode wants FIXED_SHARE.
	inv := Inventory{GPUs: []GPU{{UUID: "GPU-ts", State: "ok"}},
		Instances: []Instance{{UUID: "v1", Tenant: "acme", Guaranteed: true, GPU: "GPU-ts", Kind: TimeSliced, GI: -1, ComputeMilli: 500}}}
	pinned := true
	guarded := 0
	var events []Event
	l, err := New(SourceFunc(func(context.Context) (Inventory, error) { return inv, nil }), drv,
		Config{Mode: Static, Now: func() time.Time { return now }, OnEvent: func(e Event) { events = append(events, e) },
			Guard: func(_ context.Context, gpu string, set func() error) (bool, error) {
				guarded++
				if gpu != "GPU-ts" {
					t.Errorf("guard asked about %q", gpu)
				}
				if pinned {
					return false, nil
				}
				return true, set()
			}})
	if err != nil {
		t.Fatal(err)
	}
	steps := func() {
		for range 3 {
			if err := l.Step(context.Background()); err != nil {
				t.Fatal(err)
			}
			now = now.Add(l.cfg.Window)
		}
	}
	steps()
	if ts.sets != 0 || guarded == 0 {
		t.Fatalf("pinned GPU (not yet in the inventory): %d scheduler changes, guard asked %d times; want none, asked", ts.sets, guarded)
	}
	if g := l.Snapshot().GPUs[0]; g.Pending != nil {
		t.Fatalf("a switch refused by a pin stays pending: %+v", g.Pending)
	}
	cancelled := false
	for _, e := range events {
		cancelled = cancelled || (e.Kind == "cancelled" && e.To == FixedShare)
		if e.Kind == "switched" {
			t.Fatalf("switched over a pin: %+v", e)
		}
	}
	if !cancelled {
		t.Fatalf("no cancelled event: %+v", events)
	}
	pinned = false
	steps()
	if ts.sets == 0 {
		t.Fatal("unpinned: the guard let nothing through")
	}
}

// The loop's time slice goes to the driver as a whole number of Hz: the
// nearest settable slice inside the GPU's range (30 ms is 33.3 Hz; 33 Hz,
// 30.3 ms, would be refused).
func TestStateForSliceInsideRange(t *testing.T) {
	for ts, want := range map[time.Duration]time.Duration{
		30 * time.Millisecond: time.Second / 34,
		time.Millisecond:      time.Millisecond,
		6 * time.Millisecond:  time.Second / 167,
		time.Hour:             time.Second / 34,
	} {
		p := &gpuPoller{l: &Loop{cfg: Config{Timeslice: ts}}, caps: Caps{MinTimeslice: time.Millisecond, MaxTimeslice: 30 * time.Millisecond}}
		if got := p.stateFor(FixedShare).Timeslice; got != want {
			t.Errorf("configured %v: sets %v, want %v", ts, got, want)
		}
	}
}
