package share

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// fakeGIGPU is a MIG GPU whose GPU instances have schedulers of their
// own: busy ones refuse a set (a VM runs in them, NOT_SUPPORTED), and
// reads of unsupported ones are NOT_SUPPORTED.
type fakeGIGPU struct {
	fakeGPU
	mu          sync.Mutex
	state       map[int]State
	busy        map[int]bool
	unsupported map[int]bool
	giSets      map[int]int
}

func (f *fakeGIGPU) GPUInstanceSchedulerState(_ context.Context, gi int) (State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unsupported[gi] {
		return State{}, gpu.ErrNotSupported
	}
	return f.state[gi], nil
}

func (f *fakeGIGPU) SetGPUInstanceSchedulerState(_ context.Context, gi int, s State) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unsupported[gi] || f.busy[gi] {
		return gpu.ErrNotSupported
	}
	f.giSets[gi]++
	f.state[gi] = s
	return nil
}

type anyDriver map[string]GPUDriver

func (d anyDriver) GPU(uuid string) GPUDriver { return d[uuid] }

// giHost is a GB20x-like GPU in MIG mode with four GPU instances that
// host vGPUs: 1 with a guaranteed tenant's vGPU, 2 with a best-effort
// one's, 3 with a guaranteed one's but pinned by an operator, 4 whose
// scheduler the driver does not have.
func giHost() (*fakeGIGPU, Inventory) {
	f := &fakeGIGPU{fakeGPU: fakeGPU{mig: true},
		state:       map[int]State{1: {Policy: BestEffort}, 2: {Policy: BestEffort}, 3: {Policy: EqualShare}},
		busy:        map[int]bool{1: true},
		unsupported: map[int]bool{4: true},
		giSets:      map[int]int{}}
	inv := Inventory{
		GPUs: []GPU{{UUID: "GPU-bw", State: "ok", MIG: true, MIGSlots: 12, GPUInstanceSchedulers: []GPUInstanceScheduler{
			{GI: 1}, {GI: 2}, {GI: 3, Pinned: true, Policy: EqualShare}, {GI: 4}}}},
		Instances: []Instance{
			{UUID: "g1", Tenant: "gold", Guaranteed: true, GPU: "GPU-bw", Kind: MIG, RecordKind: "mig-vgpu", GI: 1, GISize: 3, ComputeMilli: 62},
			{UUID: "b2", Tenant: "bronze", GPU: "GPU-bw", Kind: MIG, RecordKind: "mig-vgpu", GI: 2, GISize: 3, ComputeMilli: 62},
			{UUID: "g3", Tenant: "gold", Guaranteed: true, GPU: "GPU-bw", Kind: MIG, RecordKind: "mig-vgpu", GI: 3, GISize: 3, ComputeMilli: 62},
			{UUID: "g4", Tenant: "gold", Guaranteed: true, GPU: "GPU-bw", Kind: MIG, RecordKind: "mig-vgpu", GI: 4, GISize: 3, ComputeMilli: 62},
		},
	}
	return f, inv
}

// TestGPUInstanceSchedulersStatic: under the static mode the loop gives
// the GPU instance holding a guaranteed tenant's vGPU FIXED_SHARE, pending
// while a VM runs in it and set when it stops; it leaves alone a GPU
// instance with nothing guaranteed (already on the shared policy), one an
// operator pinned and one whose scheduler the driver lacks; each decision
// is an event naming the GPU instance.
func TestGPUInstanceSchedulersStatic(t *testing.T) {
	now := time.Unix(1000, 0)
	f, inv := giHost()
	var mu sync.Mutex
	var events []Event
	l, err := New(SourceFunc(func(context.Context) (Inventory, error) { return inv, nil }), anyDriver{"GPU-bw": f},
		Config{Mode: Static, Now: func() time.Time { return now }, OnEvent: func(e Event) { mu.Lock(); events = append(events, e); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	window := func() {
		for range 2 {
			if err := l.Step(context.Background()); err != nil {
				t.Fatal(err)
			}
			now = now.Add(l.cfg.Window)
		}
	}
	window()
	gi := func(n int) GPUInstanceShares {
		for _, v := range l.Snapshot().GPUs[0].GPUInstances {
			if v.GI == n {
				return v
			}
		}
		t.Fatalf("snapshot lacks GPU instance %d: %+v", n, l.Snapshot().GPUs[0].GPUInstances)
		return GPUInstanceShares{}
	}
	if v := gi(1); v.Desired != FixedShare || v.Pending == nil || v.Pending.To != FixedShare || f.giSets[1] != 0 {
		t.Fatalf("GPU instance 1 with a VM running: %+v, %d sets; want fixed share pending", v, f.giSets[1])
	}
	mu.Lock()
	pending := len(events) == 1 && events[0].Kind == "pending" && events[0].GPUInstance != nil && *events[0].GPUInstance == 1 &&
		strings.HasPrefix(events[0].String(), "GPU GPU-bw GPU instance 1: pending best_effort -> fixed_share")
	mu.Unlock()
	if !pending {
		t.Fatalf("events %v; want one pending event of GPU instance 1", events)
	}
	f.mu.Lock()
	f.busy[1] = false
	f.mu.Unlock()
	window()
	if v := gi(1); v.Policy != FixedShare || v.Pending != nil || v.Switches != 1 || f.giSets[1] != 1 {
		t.Fatalf("GPU instance 1 after its VM stopped: %+v, %d sets", v, f.giSets[1])
	}
	window()
	if f.giSets[1] != 1 || f.giSets[2] != 0 || f.giSets[3] != 0 || f.giSets[4] != 0 {
		t.Fatalf("sets %v; want one, on GPU instance 1", f.giSets)
	}
	if v := gi(3); !v.Pinned || v.Desired != EqualShare || f.state[3].Policy != EqualShare {
		t.Fatalf("pinned GPU instance 3: %+v, driver %+v", v, f.state[3])
	}
	if v := gi(4); v.Supported {
		t.Fatalf("GPU instance 4 without a scheduler: %+v", v)
	}
	// The GPU instance goes: the loop forgets it.
	inv.GPUs[0].GPUInstanceSchedulers = inv.GPUs[0].GPUInstanceSchedulers[1:]
	window()
	if p := l.pollers["GPU-bw"]; p.gis[1] != nil {
		t.Fatal("a GPU instance that is gone is still remembered")
	}
	// A driver without per-GPU-instance schedulers: nothing to drive.
	l2, err := New(SourceFunc(func(context.Context) (Inventory, error) { return inv, nil }), fakeDriver{"GPU-bw": &fakeGPU{mig: true}},
		Config{Mode: Static, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Step(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestGPUInstanceSchedulerAdaptive: under the adaptive mode a GPU
// instance whose guaranteed vGPU stays starved for Hold goes to
// FIXED_SHARE, and back to the shared policy after ReleaseHold without
// contention, each GPU instance on its own.
func TestGPUInstanceSchedulerAdaptive(t *testing.T) {
	now := time.Unix(1000, 0)
	f, inv := giHost()
	f.busy[1] = false
	l, err := New(SourceFunc(func(context.Context) (Inventory, error) { return inv, nil }), anyDriver{"GPU-bw": f},
		Config{Mode: Adaptive, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Step(context.Background()); err != nil {
		t.Fatal(err)
	}
	p := l.pollers["GPU-bw"]
	ctx := context.Background()
	starved := []InstanceShare{
		{UUID: "g1", Tenant: "gold", Active: true, Saturated: true, Entitled: 0.062, Demand: 0.25, Achieved: 0.03, Interference: 0.5},
		{UUID: "b2", Tenant: "bronze", Active: true, Demand: 0.1, Achieved: 0.1},
	}
	calm := []InstanceShare{{UUID: "g1", Tenant: "gold", Active: true, Entitled: 0.062, Demand: 0.01, Achieved: 0.01}}
	p.decideGIs(ctx, now, l.cfg.Hold/2, inv.Instances, starved)
	if f.giSets[1] != 0 {
		t.Fatalf("switched before Hold: %v", f.giSets)
	}
	p.decideGIs(ctx, now, l.cfg.Hold/2, inv.Instances, starved)
	if f.giSets[1] != 1 || f.state[1].Policy != FixedShare || f.giSets[2] != 0 {
		t.Fatalf("after Hold starved: sets %v, GPU instance 1 %+v; want fixed share on 1 only", f.giSets, f.state[1])
	}
	p.decideGIs(ctx, now, l.cfg.ReleaseHold/2, inv.Instances, calm)
	if f.state[1].Policy != FixedShare {
		t.Fatalf("released before ReleaseHold: %+v", f.state[1])
	}
	p.decideGIs(ctx, now, l.cfg.ReleaseHold/2, inv.Instances, calm)
	if f.state[1].Policy != l.cfg.SharedPolicy || f.giSets[1] != 2 {
		t.Fatalf("after ReleaseHold calm: GPU instance 1 %+v, sets %v; want the shared policy", f.state[1], f.giSets)
	}
}
