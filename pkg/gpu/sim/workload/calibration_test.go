package workload_test

import (
	"math"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sim/workload"
)

// The model's figures, measured on the simulated host that feeds it: the
// calibration's published figures (docs/metrics.md) and the policies.

// measure advances d in steps and returns the truth shares of every
// instance over the last `window` of it.
func measure(t testing.TB, h *sim.Host, d, window time.Duration) func(key string) workload.Shares {
	t.Helper()
	if err := h.Advance(d - window); err != nil {
		t.Fatal(err)
	}
	a, err := h.Truth()
	if err != nil {
		t.Fatal(err)
	}
	for step := time.Duration(0); step < window; step += 100 * time.Millisecond {
		if err := h.Advance(100 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	b, err := h.Truth()
	if err != nil {
		t.Fatal(err)
	}
	return func(key string) workload.Shares { return b.Between(a, key) }
}

func TestCalibrationTimeSlicedNoisyNeighbour(t *testing.T) {
	// The published figure: a time-sliced noisy neighbour costs its victim
	// about 25% of throughput. Reference: the victim at 80% of its L4-12C
	// share (0.4 of the GPU), best-effort scheduler, defaults.
	const demand = 0.4
	alone := func(withNoisy bool) float64 {
		h, sc := simhost.Scenario(t, "noisy-best-effort", func(s *sim.Scenario) {
			s.Instance("victim").Workload.Demand = demand
			if !withNoisy {
				s.Instance("noisy").Workload = workload.Workload{Kind: workload.Idle}
			}
		})
		return measure(t, h, 12*time.Second, 10*time.Second)(sc.Instance("victim").Key).Achieved
	}
	solo, shared := alone(false), alone(true)
	loss := 1 - shared/solo
	t.Logf("victim at %.2f: alone %.4f, with noisy neighbour %.4f: throughput loss %.1f%%", demand, solo, shared, 100*loss)
	if math.Abs(solo-demand) > 0.005 {
		t.Errorf("alone the victim gets %.4f, want its demand %.2f", solo, demand)
	}
	if loss < 0.20 || loss > 0.30 {
		t.Errorf("noisy neighbour costs the victim %.1f%%, want about 25%% (20..30)", 100*loss)
	}
}

func TestCalibrationMIG(t *testing.T) {
	// MIG neighbours cost a victim about 1-2% (shared power at the default
	// limit); a saturated MIG instance gets its slice within 5%.
	run := func(neighbours bool) (victim float64, all map[string]workload.Shares) {
		h, sc := simhost.Scenario(t, "mig-power-cap", func(s *sim.Scenario) {
			s.PowerCaps = nil
			if !neighbours {
				for i := range s.Instances[1:] {
					s.Instances[1+i].Workload = workload.Workload{Kind: workload.Idle}
				}
			}
		})
		m := measure(t, h, 6*time.Second, 5*time.Second)
		all = map[string]workload.Shares{}
		for _, x := range sc.Instances {
			all[x.Name] = m(x.Key)
		}
		return all["victim"].Achieved, all
	}
	solo, _ := run(false)
	shared, all := run(true)
	loss := 1 - shared/solo
	t.Logf("MIG 1g victim: alone %.5f, with six noisy neighbours %.5f: loss %.2f%%", solo, shared, 100*loss)
	if loss < 0.01 || loss > 0.02 {
		t.Errorf("MIG neighbours cost the victim %.2f%%, want 1-2%%", 100*loss)
	}
	for name, s := range all {
		if err := math.Abs(s.Achieved-1.0/7) / (1.0 / 7); err > 0.05 {
			t.Errorf("%s achieved %.4f of the GPU, %.1f%% off its slice (want within 5%%)", name, s.Achieved, 100*err)
		}
	}
}

func TestPowerCapThrottlesMIG(t *testing.T) {
	h, sc := simhost.Scenario(t, "mig-power-cap", nil)
	s := measure(t, h, 6*time.Second, 5*time.Second)(sc.Instance("victim").Key)
	idx := 1 - s.Achieved/(1.0/7)
	t.Logf("capped MIG victim: achieved %.4f, index %.3f, throttled %.2fs of 5s", s.Achieved, idx, s.Throttle[1])
	if idx < 0.1 {
		t.Errorf("a 450 W cap with six noisy neighbours should cost the victim over 10%%, got %.1f%%", 100*idx)
	}
	if s.Throttle[1] < 4.9 {
		t.Errorf("victim throttled %.2fs of 5s, want all of it (sw_power_cap)", s.Throttle[1])
	}
	lib := h.NVML()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	d, _ := lib.DeviceGetHandleByPciBusId(sc.Instance("victim").GPU)
	reasons, ret := d.GetCurrentClocksEventReasons()
	if ret != nvml.SUCCESS || reasons&nvml.ClocksEventReasonSwPowerCap == 0 {
		t.Errorf("clock event reasons %#x, %v: want SwPowerCap", reasons, ret)
	}
	clk, _ := d.GetClockInfo(nvml.CLOCK_SM)
	maxClk, _ := d.GetMaxClockInfo(nvml.CLOCK_SM)
	if clk >= maxClk {
		t.Errorf("SM clock %d MHz is not below the max %d under the cap", clk, maxClk)
	}
	limit, _ := d.GetEnforcedPowerLimit()
	power, _ := d.GetPowerUsage()
	if limit != 450000 || power > limit+1000 || power < limit-20000 {
		t.Errorf("power %d mW against an enforced limit of %d mW: want at the limit", power, limit)
	}
}

func TestTimeSlicedPolicies(t *testing.T) {
	// The victim uses its whole L4-12C share (0.5) next to the noisy neighbour.
	cases := []struct {
		name   string
		policy uint32
		min    float64
		max    float64
	}{
		{"best effort starves the victim", nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT, 0.25, 0.35},
		{"fixed share holds its share", nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE, 0.48, 0.5},
		{"equal share holds half", nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE, 0.48, 0.5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, sc := simhost.Scenario(t, "noisy-best-effort", nil)
			victim, noisy := sc.Instance("victim"), sc.Instance("noisy")
			lib := h.NVML()
			lib.Init()
			d, _ := lib.DeviceGetHandleByPciBusId(victim.GPU)
			set := nvml.VgpuSchedulerState_v2{EngineId: nvml.VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS, SchedulerPolicy: c.policy}
			if ret := d.SetVgpuSchedulerState_v2(&set); c.policy != nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT && ret != nvml.ERROR_NOT_SUPPORTED {
				t.Fatalf("scheduler change with VMs running: %v, want NOT_SUPPORTED", ret)
			}
			for _, x := range []*sim.ScenarioInstance{victim, noisy} {
				if err := x.StopVM(h); err != nil {
					t.Fatal(err)
				}
			}
			if ret := d.SetVgpuSchedulerState_v2(&set); ret != nvml.SUCCESS {
				t.Fatalf("scheduler change with no VM: %v", ret)
			}
			for _, x := range []*sim.ScenarioInstance{victim, noisy} {
				if err := x.StartVM(h); err != nil {
					t.Fatal(err)
				}
			}
			got := measure(t, h, 6*time.Second, 5*time.Second)(victim.Key).Achieved
			t.Logf("victim achieved %.4f", got)
			if got < c.min || got > c.max {
				t.Errorf("victim achieved %.4f, want %.2f..%.2f", got, c.min, c.max)
			}
		})
	}
}
