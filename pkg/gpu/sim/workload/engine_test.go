package workload_test

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu/sim/workload"
)

// l4 is a time-sliced L4 with two L4-12C vGPUs (half the GPU each): a
// victim at 0.4 of the GPU and a noisy neighbour, described directly, as
// the simulator would describe them.
func l4(t *testing.T) *workload.GPU {
	t.Helper()
	cal := workload.DefaultCalibration()
	steady, err := workload.Workload{Kind: workload.Steady, Demand: 0.4}.WithDefaults(cal)
	if err != nil {
		t.Fatal(err)
	}
	noisy, err := workload.Workload{Kind: workload.Noisy}.WithDefaults(cal)
	if err != nil {
		t.Fatal(err)
	}
	return &workload.GPU{UUID: "GPU-l4", Power: workload.PowerOf("L4-24GB"), CapW: 72,
		Policy: nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT, Timeslice: int64(2 * time.Millisecond),
		Instances: []workload.Instance{
			{Key: "victim", Handle: 1, GI: -1, Share: 0.5, Workload: steady},
			{Key: "noisy", Handle: 2, GI: -1, Share: 0.5, Workload: noisy},
		}}
}

// run advances a manual engine in 100 ms steps for d, handing it the GPU
// that next returns at each step.
func run(e *workload.Engine, d time.Duration, next func() *workload.GPU) workload.Truth {
	var now int64
	for step := time.Duration(0); step < d; step += 100 * time.Millisecond {
		e.MoveClock(100 * time.Millisecond)
		now = e.Advance([]*workload.GPU{next()})
	}
	return e.Truth(now)
}

// TestEngineAlone: the engine needs nothing of the simulator; handed a GPU
// it serves its instances by the GPU's policy.
func TestEngineAlone(t *testing.T) {
	e := workload.NewManual(workload.DefaultCalibration(), workload.ManualEpoch)
	g := l4(t)
	tr := run(e, 2*time.Second, func() *workload.GPU { return g })
	victim := tr.Instances["victim"]
	if !victim.Active || victim.GPU != "GPU-l4" || victim.Handle != 1 || victim.GI != -1 {
		t.Errorf("victim's truth %+v: want it active on GPU-l4 with handle 1", victim)
	}
	if got := victim.Work / float64(2*time.Second); got < 0.25 || got > 0.35 {
		t.Errorf("victim achieved %.4f next to the noisy neighbour, want about 0.3", got)
	}
	if tr.GPUs["GPU-l4"].LogEntries == 0 {
		t.Error("no scheduler log entries after 2 s of best effort")
	}
}

// TestEngineEqualGPUsChangeNothing: handing the same GPU again and handing
// a new equal one give the same figures (the engine reads only the new
// one again), and a changed GPU takes effect.
func TestEngineEqualGPUsChangeNothing(t *testing.T) {
	same := workload.NewManual(workload.DefaultCalibration(), workload.ManualEpoch)
	g := l4(t)
	a := run(same, 3*time.Second, func() *workload.GPU { return g })
	fresh := workload.NewManual(workload.DefaultCalibration(), workload.ManualEpoch)
	b := run(fresh, 3*time.Second, func() *workload.GPU { return l4(t) })
	if !reflect.DeepEqual(a, b) {
		t.Errorf("the same GPU handed again and equal new ones differ:\n%+v\n%+v", a, b)
	}

	// A new GPU without the noisy neighbour takes effect; once its backlog
	// is served, the victim gets its demand.
	alone := l4(t)
	alone.Instances = alone.Instances[:1]
	c := run(same, time.Second, func() *workload.GPU { return alone })
	if c.Instances["noisy"].Active {
		t.Error("the noisy neighbour stayed active after the GPU without it was handed")
	}
	d := run(same, time.Second, func() *workload.GPU { return alone })
	if got := d.Between(c, "victim").Achieved; math.Abs(got-0.4) > 0.005 {
		t.Errorf("alone the victim achieved %.4f, want its demand 0.4", got)
	}
}
