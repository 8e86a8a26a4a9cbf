// Package sharetest runs simulator scenarios against a share loop in
// lockstep on the simulated clock, for the share loop's and the
// exporter's tests. Only tests import it.
package sharetest

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
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
	prev    sim.Truth
	// OnWindow, when set, runs after every closed window.
	OnWindow func(w Window)
}

// Window is one closed window: when (since the start), the loop's
// snapshot, and the simulator's truth over it by workload key.
type Window struct {
	At    time.Duration
	Snap  *share.Snapshot
	Truth func(key string) sim.Shares
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
		inv.GPUs = append(inv.GPUs, share.GPU{UUID: g[1], PCI: g[0], Model: sc.Spec.GPUs[i].Model, MIG: sc.Spec.GPUs[i].MIG, State: "ok"})
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
	sc, err := sim.ScenarioByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(&sc)
	}
	cat := Catalog(t)
	h, err := sim.Open(t.TempDir(), sc.Spec, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if err := h.UseManualClock(); err != nil {
		t.Fatal(err)
	}
	if err := sc.Build(h); err != nil {
		t.Fatal(err)
	}
	b := nvml.New(h.NVML(), cat, nvml.Options{})
	if err := b.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	x := &Harness{t: t, H: h, SC: &sc, Start: h.Now(), Backend: b}
	x.Inv = scenarioInventory(t, h, &sc)
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
			w := Window{At: x.Elapsed(), Snap: s, Truth: func(k string) sim.Shares { return now.Between(prev, k) }}
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

// checkTruth compares every instance's measured shares in windows after
// `from` with the simulator's truth: achieved within 2% (plus 0.002 of a
// GPU for tiny shares), the interference index within 0.02, and the
// demand estimate likewise when the instance was not saturated (then the
// estimate is a lower bound).
func (x *Harness) CheckTruth(from time.Duration, skip func(at time.Duration) bool) {
	x.t.Helper()
	n := 0
	var worstAch, worstIdx float64
	for _, w := range x.Windows {
		if w.At <= from || (skip != nil && skip(w.At)) {
			continue
		}
		for _, si := range x.SC.Instances {
			_, inst := x.Inst(si.Name)
			m := ShareOf(w.Snap, inst.UUID)
			tr := w.Truth(si.Key)
			tIdx := share.Interference(tr.Achieved, tr.Demand, inst.Entitled())
			where := fmt.Sprintf("window at %v, %s", w.At, si.Name)
			if tr.Achieved > 0.01 {
				worstAch = math.Max(worstAch, math.Abs(m.Achieved-tr.Achieved)/tr.Achieved)
			}
			worstIdx = math.Max(worstIdx, math.Abs(m.Interference-tIdx))
			if d := math.Abs(m.Achieved - tr.Achieved); d > 0.02*tr.Achieved+0.002 {
				x.t.Errorf("%s: achieved %.4f, truth %.4f", where, m.Achieved, tr.Achieved)
			}
			if d := math.Abs(m.Interference - tIdx); d > 0.02 {
				x.t.Errorf("%s: interference %.4f, truth %.4f", where, m.Interference, tIdx)
			}
			if !m.Saturated {
				if d := math.Abs(m.Demand - tr.Demand); d > 0.02*tr.Demand+0.002 {
					x.t.Errorf("%s: demand %.4f, truth %.4f", where, m.Demand, tr.Demand)
				}
			}
			n++
		}
	}
	if n == 0 {
		x.t.Fatal("no window to compare")
	}
	x.t.Logf("%s: %d instance-windows against the truth: achieved within %.2f%%, interference within %.4f", x.SC.Name, n, 100*worstAch, worstIdx)
}

// Events returns the loop's policy events so far.
func (x *Harness) Events() []share.Event {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]share.Event(nil), x.events...)
}
