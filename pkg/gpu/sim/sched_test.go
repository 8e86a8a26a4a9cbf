package sim_test

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// scenarioHost opens a fresh host for a scenario on the manual clock and builds it.
func scenarioHost(t testing.TB, name string, edit func(*sim.Scenario)) (*sim.Host, *sim.Scenario) {
	t.Helper()
	sc, err := sim.ScenarioByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(&sc)
	}
	h, err := sim.Open(t.TempDir(), sc.Spec, catalog(t), sim.OpenOptions{})
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
	return h, &sc
}

// measure advances d in steps and returns the truth shares of every
// instance over the last `window` of it.
func measure(t testing.TB, h *sim.Host, d, window time.Duration) func(key string) sim.Shares {
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
	return func(key string) sim.Shares { return b.Between(a, key) }
}

func TestCalibrationTimeSlicedNoisyNeighbour(t *testing.T) {
	// The published figure: a time-sliced noisy neighbour costs its victim
	// about 25% of throughput. Reference: the victim at 80% of its L4-12C
	// share (0.4 of the GPU), best-effort scheduler, defaults.
	const demand = 0.4
	alone := func(withNoisy bool) float64 {
		h, sc := scenarioHost(t, "noisy-best-effort", func(s *sim.Scenario) {
			s.Instance("victim").Workload.Demand = demand
			if !withNoisy {
				s.Instance("noisy").Workload = sim.Workload{Kind: sim.WorkloadIdle}
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
	run := func(neighbours bool) (victim float64, all map[string]sim.Shares) {
		h, sc := scenarioHost(t, "mig-power-cap", func(s *sim.Scenario) {
			s.PowerCaps = nil
			if !neighbours {
				for i := range s.Instances[1:] {
					s.Instances[1+i].Workload = sim.Workload{Kind: sim.WorkloadIdle}
				}
			}
		})
		m := measure(t, h, 6*time.Second, 5*time.Second)
		all = map[string]sim.Shares{}
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
	h, sc := scenarioHost(t, "mig-power-cap", nil)
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
			h, sc := scenarioHost(t, "noisy-best-effort", nil)
			victim, noisy := sc.Instance("victim"), sc.Instance("noisy")
			lib := h.NVML()
			lib.Init()
			d, _ := lib.DeviceGetHandleByPciBusId(victim.GPU)
			set := nvml.VgpuSchedulerSetState{SchedulerPolicy: c.policy}
			if ret := d.SetVgpuSchedulerState(&set); c.policy != nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT && ret != nvml.ERROR_NOT_SUPPORTED {
				t.Fatalf("scheduler change with VMs running: %v, want NOT_SUPPORTED", ret)
			}
			for _, x := range []*sim.ScenarioInstance{victim, noisy} {
				if err := x.StopVM(h); err != nil {
					t.Fatal(err)
				}
			}
			if ret := d.SetVgpuSchedulerState(&set); ret != nvml.SUCCESS {
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

func TestSchedulerLog(t *testing.T) {
	h, sc := scenarioHost(t, "noisy-best-effort", nil)
	lib := h.NVML()
	lib.Init()
	d, _ := lib.DeviceGetHandleByPciBusId(sc.Instance("victim").GPU)
	if err := h.Advance(200 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	log, ret := d.GetVgpuSchedulerLog()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if log.EntriesCount == 0 || log.EntriesCount >= 200 {
		t.Fatalf("%d entries after 200 ms, want some and fewer than the ring", log.EntriesCount)
	}
	if log.SchedulerPolicy != nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT || binary.LittleEndian.Uint32(log.SchedulerParams[:4]) != 2_000_000 {
		t.Errorf("log policy %d timeslice %d", log.SchedulerPolicy, binary.LittleEndian.Uint32(log.SchedulerParams[:4]))
	}
	sum := map[uint32]uint64{}
	var prev uint64
	for _, e := range log.LogEntries[:log.EntriesCount] {
		if e.Timestamp <= prev {
			t.Fatalf("entries out of order: %d after %d", e.Timestamp, prev)
		}
		prev = e.Timestamp
		sum[e.SwRunlistId] += e.TimeRun
		if e.TimeRunTotal != sum[e.SwRunlistId] {
			t.Fatalf("runlist %d: total %d, sum of runs %d", e.SwRunlistId, e.TimeRunTotal, sum[e.SwRunlistId])
		}
	}
	if len(sum) != 2 {
		t.Errorf("%d runlists in the log, want the two vGPUs", len(sum))
	}
	// Unread for two seconds, the ring keeps only its last 200 entries.
	if err := h.Advance(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	log, _ = d.GetVgpuSchedulerLog()
	if log.EntriesCount != 200 || log.LogEntries[0].Timestamp <= prev {
		t.Errorf("after 2s: %d entries, oldest %d (last read %d): want a full ring that overran", log.EntriesCount, log.LogEntries[0].Timestamp, prev)
	}
}

func TestTelemetryRules(t *testing.T) {
	h, sc := scenarioHost(t, "quiet", nil)
	lib := h.NVML()
	lib.Init()
	mig, _ := lib.DeviceGetHandleByPciBusId(sc.Instance("mig-a").GPU)
	ts, _ := lib.DeviceGetHandleByPciBusId(sc.Instance("l4-a").GPU)
	if err := h.Advance(1500 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, ret := mig.GetVgpuSchedulerLog(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("scheduler log with MIG on: %v, want NOT_SUPPORTED", ret)
	}
	if _, ret := mig.GetUtilizationRates(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("utilization rates with MIG on: %v, want NOT_SUPPORTED", ret)
	}
	u, ret := ts.GetUtilizationRates()
	if ret != nvml.SUCCESS || u.Gpu < 50 || u.Gpu > 60 {
		t.Errorf("L4 utilization %d%% (%v), want about 55%%", u.Gpu, ret)
	}
	_, samples, ret := ts.GetVgpuUtilization(0)
	if ret != nvml.SUCCESS || len(samples) == 0 {
		t.Fatalf("vGPU utilization: %v, %d samples", ret, len(samples))
	}
	last := samples[len(samples)-1].TimeStamp
	if _, _, ret := ts.GetVgpuUtilization(last); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("no sample newer than the last: %v, want NOT_FOUND", ret)
	}
	// GPM on the MIG GPU: the 1g instance at 0.1 of the GPU keeps 70% of its slice busy.
	a, _ := lib.GpmSampleAlloc()
	b, _ := lib.GpmSampleAlloc()
	gi := sc.Instance("mig-a").GIID
	if ret := lib.GpmMigSampleGet(mig, gi, a); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	h.Advance(time.Second)
	lib.GpmMigSampleGet(mig, gi, b)
	m := nvml.GpmMetricsGetType{Version: nvml.GPM_METRICS_GET_VERSION, NumMetrics: 1, Sample1: a, Sample2: b}
	m.Metrics[0].MetricId = uint32(nvml.GPM_METRIC_SM_UTIL)
	if ret := lib.GpmMetricsGet(&m); ret != nvml.SUCCESS || math.Abs(m.Metrics[0].Value-70) > 0.5 {
		t.Errorf("GPM SM util %.2f%% (%v), want 70%%", m.Metrics[0].Value, ret)
	}
	found := false
	for i := 0; ; i++ {
		md, ret := mig.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND {
			break
		}
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		if id, _ := md.GetGpuInstanceId(); id == gi {
			found = true
			mem, _ := md.GetMemoryInfo()
			if mem.Used == 0 || mem.Used > mem.Total {
				t.Errorf("MIG device %d of GI %d: memory %+v", i, gi, mem)
			}
		}
	}
	if !found {
		t.Errorf("no MIG device for GI %d", gi)
	}
}

func TestManualClock(t *testing.T) {
	h, err := sim.Open(t.TempDir(), nil, catalog(t), sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.Advance(time.Second); !errors.Is(err, sim.ErrRealTime) {
		t.Errorf("Advance on the wall clock: %v, want ErrRealTime", err)
	}
	if err := h.UseManualClock(); err != nil {
		t.Fatal(err)
	}
	t0 := h.Now()
	h.Advance(90 * time.Second)
	if got := h.Now().Sub(t0); got != 90*time.Second {
		t.Errorf("manual clock moved %v, want 90s", got)
	}
	if err := h.SetWorkload("nonesuch", sim.Workload{Kind: sim.WorkloadSteady}); !errors.Is(err, sim.ErrNoSuchDevice) {
		t.Errorf("workload on an unknown device: %v", err)
	}
}
