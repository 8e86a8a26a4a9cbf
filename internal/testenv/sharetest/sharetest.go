// Package sharetest runs simulator scenarios against a share loop in
// lockstep on the simulated clock, for the share loop's and the
// exporter's tests. Only tests import it.
//
// Imports: internal/testenv/simhost, pkg/gpu, pkg/gpu/nvml, pkg/gpu/sim, pkg/gpu/sim/workload, pkg/profile, pkg/share, pkg/share/nvmldriver, profiles.
package sharetest

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sim/workload"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/share"
	"github.com/vgpud/vgpud/pkg/share/nvmldriver"
	"github.com/vgpud/vgpud/profiles"
)

// harness runs a simulator scenario and a share loop in lockstep on the
// simulated clock: advance one poll, step the loop.
type Harness struct {
	t testing.TB
	// H is the simulated host, SC the built scenario, Loop the share loop
	// under test, Inv the inventory it is given, Start the scenario's start.
	H     *sim.Host
	SC    *sim.Scenario
	Loop  *share.Loop
	Inv   share.Inventory
	Start time.Time
	// Backend is the NVML backend over the simulated host.
	Backend *nvml.Backend

	mu     sync.Mutex
	events []share.Event
	// Windows holds each closed window's snapshot with the truth over it.
	Windows []Window
	prev    workload.Truth
	// OnWindow, when set, runs after every closed window.
	OnWindow func(w Window)
}

// Window is one closed window: when (since the start), the loop's
// snapshot, and the simulator's truth over it by workload key.
type Window struct {
	At    time.Duration
	Snap  *share.Snapshot
	Truth func(key string) workload.Shares
}

func Catalog(t testing.TB) *profile.Catalog {
	t.Helper()
	c, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ScenarioInventory is what the manager would report for a scenario.
func scenarioInventory(t testing.TB, h *sim.Host, sc *sim.Scenario) share.Inventory {
	t.Helper()
	var inv share.Inventory
	gpus, err := h.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range gpus {
		inv.GPUs = append(inv.GPUs, share.GPU{Index: i, UUID: g[1], PCI: g[0], Model: sc.Spec.GPUs[i].Model, MIG: sc.Spec.GPUs[i].MIG, State: gpu.StateOK})
	}
	tenants := map[string]bool{}
	for _, x := range sc.Instances {
		kind, gi := share.TimeSliced, -1
		if x.MIG {
			kind, gi = share.MIG, x.GIID
		}
		inv.Instances = append(inv.Instances, share.Instance{UUID: x.UUID, Tenant: x.Tenant, Guaranteed: x.Guaranteed, GPU: x.GPUUUID,
			Kind: kind, Profile: x.Profile, VM: x.VMName, VMUUID: x.VMUUID, MdevUUID: x.Mdev, VF: x.VF, GI: gi, TypeID: x.TypeID,
			ComputeMilli: x.Compute, VRAMBytes: x.VRAMBytes})
		if _, ok := tenants[x.Tenant]; !ok {
			tenants[x.Tenant] = x.Guaranteed
			inv.Tenants = append(inv.Tenants, share.Tenant{Name: x.Tenant, Guaranteed: x.Guaranteed})
		}
	}
	return inv
}

func New(t testing.TB, name string, cfg share.Config, edit func(*sim.Scenario)) *Harness {
	t.Helper()
	h, sc := simhost.Scenario(t, name, edit)
	b := nvml.New(h.NVML(), Catalog(t), nvml.Options{})
	if err := b.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	x := &Harness{t: t, H: h, SC: sc, Start: h.Now(), Backend: b}
	x.Inv = scenarioInventory(t, h, sc)
	cfg.Now = h.Now
	cfg.OnEvent = func(e share.Event) {
		x.mu.Lock()
		x.events = append(x.events, e)
		x.mu.Unlock()
	}
	loop, err := share.New(share.SourceFunc(func(context.Context) (share.Inventory, error) { return x.Inv, nil }), nvmldriver.New(b), cfg)
	if err != nil {
		t.Fatal(err)
	}
	x.Loop = loop
	x.prev, _ = h.Truth()
	return x
}

func (x *Harness) Elapsed() time.Duration { return x.H.Now().Sub(x.Start) }

// run advances the scenario by d, poll by poll, running its events as
// they fall due and recording every window.
func (x *Harness) Run(d time.Duration) {
	x.t.Helper()
	poll := x.Loop.Config().Poll
	ctx := context.Background()
	if x.Elapsed() == 0 {
		if err := x.Loop.Step(ctx); err != nil {
			x.t.Fatal(err)
		}
	}
	for end := x.Elapsed() + d; x.Elapsed() < end; {
		from := x.Elapsed()
		if err := x.H.Advance(poll); err != nil {
			x.t.Fatal(err)
		}
		for _, e := range x.SC.Due(from, x.Elapsed()) {
			if err := e.Do(x.H, x.SC); err != nil {
				x.t.Fatalf("event %s: %v", e.Name, err)
			}
		}
		before := x.Loop.Snapshot().Windows
		if err := x.Loop.Step(ctx); err != nil {
			x.t.Fatal(err)
		}
		if s := x.Loop.Snapshot(); s.Windows != before {
			now, err := x.H.Truth()
			if err != nil {
				x.t.Fatal(err)
			}
			prev := x.prev
			w := Window{At: x.Elapsed(), Snap: s, Truth: func(k string) workload.Shares { return now.Between(prev, k) }}
			x.Windows = append(x.Windows, w)
			x.prev = now
			if x.OnWindow != nil {
				x.OnWindow(w)
			}
		}
	}
}

func (x *Harness) Inst(name string) (sim.ScenarioInstance, share.Instance) {
	si := x.SC.Instance(name)
	for _, i := range x.Inv.Instances {
		if i.UUID == si.UUID {
			return *si, i
		}
	}
	x.t.Fatalf("no instance %s", name)
	return sim.ScenarioInstance{}, share.Instance{}
}

func ShareOf(s *share.Snapshot, uuid string) share.InstanceShare {
	for _, i := range s.Instances {
		if i.UUID == uuid {
			return i
		}
	}
	return share.InstanceShare{}
}

func GPUOf(s *share.Snapshot, uuid string) share.GPUShares {
	for _, g := range s.GPUs {
		if g.UUID == uuid {
			return g
		}
	}
	return share.GPUShares{}
}

// Tolerances of a measured window against the simulator's truth. Shares
// (achieved, demand): a relative 2% of the true value; below ShareFloor
// (1% of a GPU) 2% of the floor, ±0.0002, since the relative error of a
// near-zero share says nothing. The interference index 1 - a/m is a
// difference, so a relative error of the achieved share a shows in it
// scaled by a/m = 1 - index: it is held to 2% of (1 - true index), the
// served fraction of what the instance was owed (at least 2% of
// ServedFloor, ±0.002, for an instance that got almost nothing).
const (
	RelTol      = 0.02
	ShareFloor  = 0.01
	ServedFloor = 0.1
)

// Within says whether got is within RelTol of want, or of floor when want
// is smaller.
func Within(got, want, floor float64) bool {
	return math.Abs(got-want) <= RelTol*math.Max(math.Abs(want), floor)
}

// WithinIndex says whether an interference index is within tolerance of
// the true one (see RelTol).
func WithinIndex(got, want float64) bool {
	return math.Abs(got-want) <= RelTol*math.Max(1-want, ServedFloor)
}

// Mismatches compares one instance's measured window with the truth over
// it and says what is off: the achieved share, the interference index,
// and the demand estimate. Demand is compared in every case: exactly when
// the instance was not saturated; when saturated, the estimate is
// max(achieved, nominal) (docs/metrics.md), which is checked against the
// truth's achieved share and the nominal share, and it must not exceed
// the true demand when that is at least the nominal share (a lower bound).
func Mismatches(inst share.Instance, got share.InstanceShare, tr workload.Shares) []string {
	var out []string
	if !Within(got.Achieved, tr.Achieved, ShareFloor) {
		out = append(out, fmt.Sprintf("achieved %.4f, truth %.4f", got.Achieved, tr.Achieved))
	}
	if want := share.Interference(tr.Achieved, tr.Demand, inst.Entitled()); !WithinIndex(got.Interference, want) {
		out = append(out, fmt.Sprintf("interference %.4f, truth %.4f", got.Interference, want))
	}
	switch {
	case !got.Saturated:
		if !Within(got.Demand, tr.Demand, ShareFloor) {
			out = append(out, fmt.Sprintf("demand %.4f, truth %.4f", got.Demand, tr.Demand))
		}
	default:
		if want := math.Max(tr.Achieved, inst.Nominal()); !Within(got.Demand, want, ShareFloor) {
			out = append(out, fmt.Sprintf("saturated demand %.4f, want max(achieved %.4f, nominal %.4f)", got.Demand, tr.Achieved, inst.Nominal()))
		}
		if tr.Demand >= inst.Nominal() && got.Demand > tr.Demand*(1+RelTol) {
			out = append(out, fmt.Sprintf("saturated demand %.4f above the truth %.4f", got.Demand, tr.Demand))
		}
	}
	return out
}

// CheckTruth compares every instance's measured shares in windows after
// `from` (and not skipped) with the simulator's truth (Mismatches).
func (x *Harness) CheckTruth(from time.Duration, skip func(at time.Duration) bool) {
	x.t.Helper()
	n := 0
	var worstAch, worstIdx, worstDem float64
	for _, w := range x.Windows {
		if w.At <= from || (skip != nil && skip(w.At)) {
			continue
		}
		for _, si := range x.SC.Instances {
			_, inst := x.Inst(si.Name)
			m := ShareOf(w.Snap, inst.UUID)
			tr := w.Truth(si.Key)
			tIdx := share.Interference(tr.Achieved, tr.Demand, inst.Entitled())
			worstAch = math.Max(worstAch, math.Abs(m.Achieved-tr.Achieved)/math.Max(tr.Achieved, ShareFloor))
			worstIdx = math.Max(worstIdx, math.Abs(m.Interference-tIdx)/math.Max(1-tIdx, ServedFloor))
			if !m.Saturated {
				worstDem = math.Max(worstDem, math.Abs(m.Demand-tr.Demand)/math.Max(tr.Demand, ShareFloor))
			}
			for _, e := range Mismatches(inst, m, tr) {
				x.t.Errorf("window at %v, %s: %s", w.At, si.Name, e)
			}
			n++
		}
	}
	if n == 0 {
		x.t.Fatal("no window to compare")
	}
	x.t.Logf("%s: %d instance-windows against the truth: achieved within %.2f%%, interference within %.2f%% of the served fraction, unsaturated demand within %.2f%%",
		x.SC.Name, n, 100*worstAch, 100*worstIdx, 100*worstDem)
}

// Events returns the loop's policy events so far.
func (x *Harness) Events() []share.Event {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]share.Event(nil), x.events...)
}
