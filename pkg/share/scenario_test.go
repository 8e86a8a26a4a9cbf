package share_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv/sharetest"
	"github.com/vgpud/vgpud/pkg/gpu/sim/workload"
	"github.com/vgpud/vgpud/pkg/share"
)

var (
	shareOf = sharetest.ShareOf
	gpuOf   = sharetest.GPUOf
)

func TestScenarioQuiet(t *testing.T) {
	x := sharetest.New(t, "quiet", share.Config{Mode: share.Adaptive}, nil)
	x.Run(15 * time.Second)
	worst := 0.0
	for _, w := range x.Windows[2:] {
		for _, s := range w.Snap.Instances {
			worst = math.Max(worst, s.Interference)
			if s.Interference > 0.02 {
				t.Errorf("window at %v: %s (%s) interference %.3f on a quiet host, want <= 0.02", w.At, s.UUID, s.Tenant, s.Interference)
			}
			if !s.Active {
				t.Errorf("window at %v: %s inactive", w.At, s.UUID)
			}
		}
	}
	t.Logf("quiet host: worst interference %.4f over %d windows", worst, len(x.Windows)-2)
	x.CheckTruth(2*time.Second, nil)
	last := x.Windows[len(x.Windows)-1].Snap
	_, l4 := x.Inst("l4-a")
	if g := gpuOf(last, l4.GPU); g.Policy != share.BestEffort || g.Pending != nil || math.Abs(g.Fairness-1) > 0.01 {
		t.Errorf("L4: policy %s pending %v fairness %.3f: want best effort, nothing pending, fair", g.Policy, g.Pending, g.Fairness)
	}
	_, mig := x.Inst("mig-a")
	if g := gpuOf(last, mig.GPU); g.Supported || g.Policy != share.Unsupported || !strings.Contains(g.SupportReason, "NOT_SUPPORTED") {
		t.Errorf("MIG GPU: supported %v policy %s (%q): want the scheduler reported NOT_SUPPORTED", g.Supported, g.Policy, g.SupportReason)
	}
	for _, ts := range last.Tenants {
		if ts.Worst > 0.02 || ts.Instances == 0 {
			t.Errorf("tenant %s: worst %.3f over %d instances", ts.Tenant, ts.Worst, ts.Instances)
		}
	}
}

func TestScenarioNoisyBestEffort(t *testing.T) {
	x := sharetest.New(t, "noisy-best-effort", share.Config{Mode: share.Observe}, nil)
	x.Run(10 * time.Second)
	_, victim := x.Inst("victim")
	_, noisy := x.Inst("noisy")
	for _, w := range x.Windows[2:] {
		v := shareOf(w.Snap, victim.UUID)
		if v.Interference < 0.3 {
			t.Errorf("window at %v: victim interference %.3f under best effort, want >= 0.3", w.At, v.Interference)
		}
		if n := shareOf(w.Snap, noisy.UUID); n.Interference != 0 || n.Entitled != 0 {
			t.Errorf("window at %v: best-effort neighbour entitled %.2f interference %.3f, want nothing owed", w.At, n.Entitled, n.Interference)
		}
	}
	last := x.Windows[len(x.Windows)-1].Snap
	v := shareOf(last, victim.UUID)
	t.Logf("victim: entitled %.3f achieved %.4f demand %.3f interference %.3f; fairness %.3f",
		v.Entitled, v.Achieved, v.Demand, v.Interference, gpuOf(last, victim.GPU).Fairness)
	x.CheckTruth(2*time.Second, nil)
	g := gpuOf(last, victim.GPU)
	if g.Policy != share.BestEffort || len(g.Switches) != 0 || len(x.Events()) != 0 {
		t.Errorf("observe mode changed something: policy %s switches %v events %v", g.Policy, g.Switches, x.Events())
	}
	if g.LogOverruns != 0 || g.LogEntries == 0 {
		t.Errorf("scheduler log: %d entries, %d overruns at 5 polls a second", g.LogEntries, g.LogOverruns)
	}
	if g.UnmatchedRunSeconds != 0 {
		t.Errorf("%.3fs of runs matched no running vGPU (the simulator's runlist is the vGPU handle)", g.UnmatchedRunSeconds)
	}
	if v.Preemptions == 0 || v.RunSeconds < 2.5 {
		t.Errorf("victim counters: %d preemptions, %.2f run seconds", v.Preemptions, v.RunSeconds)
	}
	if tr := x.Windows[len(x.Windows)-1].Truth(x.SC.Instance("victim").Key); math.Abs(v.Busy-tr.Busy) > 0.01 {
		t.Errorf("victim busy %.4f, truth %.4f", v.Busy, tr.Busy)
	}
}

func TestScenarioNoisyAdaptive(t *testing.T) {
	x := sharetest.New(t, "noisy-adaptive", share.Config{Mode: share.Adaptive}, nil)
	x.Run(30 * time.Second)
	_, victim := x.Inst("victim")
	var pending, switched *share.Event
	events := x.Events()
	for i, e := range events {
		switch e.Kind {
		case "pending":
			if pending == nil {
				pending = &events[i]
			}
		case "switched":
			if switched == nil {
				switched = &events[i]
			}
		}
	}
	if pending == nil || switched == nil {
		t.Fatalf("events %v: want a pending switch, then the switch", events)
	}
	pendAt, swAt := pending.Time.Sub(x.Start), switched.Time.Sub(x.Start)
	t.Logf("pending at %v (%s)", pendAt, pending.Reason)
	t.Logf("switched at %v: %s -> %s (%s)", swAt, switched.From, switched.To, switched.Reason)
	if pending.To != share.FixedShare || !strings.Contains(pending.Reason, "NOT_SUPPORTED") || pendAt > 6*time.Second {
		t.Errorf("pending event %+v at %v: want FIXED_SHARE refused NOT_SUPPORTED within 6s", pending, pendAt)
	}
	if switched.From != share.BestEffort || switched.To != share.FixedShare || swAt < 20*time.Second || swAt > 21*time.Second {
		t.Errorf("switch %s -> %s at %v: want best effort -> fixed share while the VMs are stopped (20s..21s)", switched.From, switched.To, swAt)
	}
	// While pending, the victim stays starved and the refusals are counted.
	for _, w := range x.Windows {
		if w.At > 6*time.Second && w.At < 20*time.Second {
			g := gpuOf(w.Snap, victim.GPU)
			if g.Pending == nil || g.Refusals[share.FixedShare]["not_supported"] == 0 || g.Policy != share.BestEffort {
				t.Errorf("window at %v: pending %v refusals %v policy %s", w.At, g.Pending, g.Refusals, g.Policy)
				break
			}
		}
	}
	// After the restart, the index falls to <= 0.05 within 2s and stays there.
	var settled time.Duration
	for _, w := range x.Windows {
		if w.At <= 21*time.Second {
			continue
		}
		v := shareOf(w.Snap, victim.UUID)
		if v.Interference <= 0.05 && settled == 0 {
			settled = w.At
		}
		if w.At >= 23*time.Second && v.Interference > 0.05 {
			t.Errorf("window at %v: victim interference %.3f under fixed share, want <= 0.05", w.At, v.Interference)
		}
	}
	if settled == 0 || settled > 23*time.Second {
		t.Errorf("victim interference settled at %v, want within 2s of the VMs' restart at 21s", settled)
	}
	last := x.Windows[len(x.Windows)-1].Snap
	v := shareOf(last, victim.UUID)
	t.Logf("victim after the switch: achieved %.4f interference %.4f (settled at %v)", v.Achieved, v.Interference, settled)
	g := gpuOf(last, victim.GPU)
	if g.Policy != share.FixedShare || g.Pending != nil || g.Switches[[2]share.Policy{share.BestEffort, share.FixedShare}] != 1 {
		t.Errorf("GPU after the switch: policy %s pending %v switches %v", g.Policy, g.Pending, g.Switches)
	}
	x.CheckTruth(2*time.Second, func(at time.Duration) bool { return at > 19*time.Second && at < 23*time.Second })
}

func TestAdaptiveReleaseWithHysteresis(t *testing.T) {
	x := sharetest.New(t, "noisy-adaptive", share.Config{Mode: share.Adaptive, ReleaseHold: 5 * time.Second}, nil)
	x.Run(24 * time.Second)
	if g := gpuOf(x.Loop.Snapshot(), x.Inv.Instances[0].GPU); g.Policy != share.FixedShare {
		t.Fatalf("policy %s after the restart, want fixed share", g.Policy)
	}
	// The neighbour goes quiet: contention is gone, and after ReleaseHold
	// the loop wants best effort back, which waits for the VMs again.
	if err := x.H.SetWorkload(x.SC.Instance("noisy").Dev, workload.Workload{Kind: workload.Idle}); err != nil {
		t.Fatal(err)
	}
	x.Run(4 * time.Second)
	if g := gpuOf(x.Loop.Snapshot(), x.Inv.Instances[0].GPU); g.Desired != share.FixedShare {
		t.Errorf("desired %s before ReleaseHold passed, want fixed share kept", g.Desired)
	}
	x.Run(3 * time.Second)
	g := gpuOf(x.Loop.Snapshot(), x.Inv.Instances[0].GPU)
	if g.Desired != share.BestEffort || g.Pending == nil || g.Pending.To != share.BestEffort {
		t.Errorf("after %v without contention: desired %s pending %+v, want best effort pending", 5*time.Second, g.Desired, g.Pending)
	}
}

func TestScenarioMIGPowerCap(t *testing.T) {
	x := sharetest.New(t, "mig-power-cap", share.Config{Mode: share.Adaptive}, nil)
	x.Run(8 * time.Second)
	_, victim := x.Inst("victim")
	last := x.Windows[len(x.Windows)-1]
	v := shareOf(last.Snap, victim.UUID)
	tr := last.Truth(x.SC.Instance("victim").Key)
	t.Logf("capped MIG victim: achieved %.4f (truth %.4f), interference %.3f, sw_power_cap %.2fs (truth %.2fs)",
		v.Achieved, tr.Achieved, v.Interference, v.ClockEventSeconds["sw_power_cap"], tr.Throttle[1])
	if v.Interference < 0.1 {
		t.Errorf("victim interference %.3f under a 450 W cap with noisy neighbours, want it to show (> 0.1)", v.Interference)
	}
	// Six windows after the first full one, the victim ran throttled all the time.
	if s := v.ClockEventSeconds["sw_power_cap"]; s < 5 || s > 8.5 {
		t.Errorf("victim sw_power_cap seconds %.2f, want about the whole run", s)
	}
	g := gpuOf(last.Snap, victim.GPU)
	if g.ClockEventSeconds["sw_power_cap"] < 5 || !g.HasTelemetry || g.Telemetry.PowerLimitW != 450 {
		t.Errorf("GPU: sw_power_cap %.2fs telemetry %v %+v", g.ClockEventSeconds["sw_power_cap"], g.HasTelemetry, g.Telemetry)
	}
	if g.Policy != share.Unsupported || len(x.Events()) != 0 {
		t.Errorf("MIG GPU policy %s, events %v: want unsupported and no switch attempted", g.Policy, x.Events())
	}
	x.CheckTruth(2*time.Second, nil)
}

func TestStaticModeReportsRefusal(t *testing.T) {
	x := sharetest.New(t, "quiet", share.Config{Mode: share.Static}, nil)
	x.Run(3 * time.Second)
	_, l4 := x.Inst("l4-a")
	g := gpuOf(x.Loop.Snapshot(), l4.GPU)
	if g.Desired != share.FixedShare || g.Policy != share.BestEffort || g.Pending == nil || g.Refusals[share.FixedShare]["not_supported"] == 0 {
		t.Errorf("L4 with guaranteed tenants and running VMs: desired %s policy %s pending %v refusals %v", g.Desired, g.Policy, g.Pending, g.Refusals)
	}
	for _, e := range x.Events() {
		if e.Kind == "switched" {
			t.Errorf("a refused switch reported as done: %v", e)
		}
	}
	// The first moment the VMs are stopped, the switch lands.
	for _, n := range []string{"l4-a", "l4-b"} {
		x.SC.Instance(n).StopVM(x.H)
	}
	x.Run(1200 * time.Millisecond)
	if g := gpuOf(x.Loop.Snapshot(), l4.GPU); g.Policy != share.FixedShare || g.Pending != nil {
		t.Errorf("with the VMs stopped: policy %s pending %v, want fixed share applied", g.Policy, g.Pending)
	}
}

func TestLateReaderCountsOverruns(t *testing.T) {
	// Polled once a second, the 200-entry ring wraps between reads: the
	// overruns are counted, and the run time still comes out right from the
	// runlists' cumulative totals.
	x := sharetest.New(t, "noisy-best-effort", share.Config{Mode: share.Observe, Poll: time.Second, Window: 2 * time.Second}, nil)
	x.Run(12 * time.Second)
	_, victim := x.Inst("victim")
	g := gpuOf(x.Loop.Snapshot(), victim.GPU)
	if g.LogOverruns == 0 {
		t.Errorf("no overrun counted with a reader late by 5x")
	}
	t.Logf("late reader: %d entries read, %d overruns", g.LogEntries, g.LogOverruns)
	for _, w := range x.Windows[2:] {
		v := shareOf(w.Snap, victim.UUID)
		tr := w.Truth(x.SC.Instance("victim").Key)
		if !sharetest.Within(v.Achieved, tr.Achieved, sharetest.ShareFloor) {
			t.Errorf("window at %v: achieved %.4f, truth %.4f despite the overrun", w.At, v.Achieved, tr.Achieved)
		}
	}
}

// A VM that starts on an idle GPU in the middle of a window is read at
// every poll from the VM event (Kick) on, not first at the window's end,
// when the driver's 200-entry log ring has wrapped.
func TestVMStartOnIdleGPU(t *testing.T) {
	for _, kick := range []bool{true, false} {
		t.Run(fmt.Sprintf("kick=%v", kick), func(t *testing.T) {
			x := sharetest.New(t, "noisy-best-effort", share.Config{Mode: share.Observe}, nil)
			x.Run(2 * time.Second)
			for _, n := range []string{"victim", "noisy"} {
				if err := x.SC.Instance(n).StopVM(x.H); err != nil {
					t.Fatal(err)
				}
			}
			x.Run(2 * time.Second)
			_, victim := x.Inst("victim")
			g := gpuOf(x.Loop.Snapshot(), victim.GPU)
			if g.ActiveVGPUs != 0 || g.LogOverruns != 0 {
				t.Fatalf("%d active vGPUs, %d overruns with the VMs stopped", g.ActiveVGPUs, g.LogOverruns)
			}
			read := g.LogEntries
			x.Run(200 * time.Millisecond)
			for _, n := range []string{"victim", "noisy"} {
				if err := x.SC.Instance(n).StartVM(x.H); err != nil {
					t.Fatal(err)
				}
			}
			if kick {
				x.Loop.Kick()
			}
			x.Run(3 * time.Second)
			g = gpuOf(x.Loop.Snapshot(), victim.GPU)
			t.Logf("after the start: %d entries, %d overruns", g.LogEntries-read, g.LogOverruns)
			if g.LogEntries == read || g.ActiveVGPUs != 2 {
				t.Fatalf("%d entries read, %d active vGPUs after the VMs started", g.LogEntries-read, g.ActiveVGPUs)
			}
			// Without the event the first read comes at the window's end,
			// past the ring: the case the kick exists for.
			if kick != (g.LogOverruns == 0) {
				t.Errorf("kick %v: %d overruns", kick, g.LogOverruns)
			}
		})
	}
}
