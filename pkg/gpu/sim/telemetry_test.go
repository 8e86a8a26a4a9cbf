package sim_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sim/workload"
)

// The NVML calls the workload model serves and the Host's clock: what the
// driver reports of the model, and when it refuses.

func TestSchedulerLog(t *testing.T) {
	h, sc := simhost.Scenario(t, "noisy-best-effort", nil)
	lib := h.NVML()
	lib.Init()
	d, _ := lib.DeviceGetHandleByPciBusId(sc.Instance("victim").GPU)
	if err := h.Advance(200 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	log, ret := d.GetVgpuSchedulerLog_v2(nvml.VgpuSchedulerLogInfo_v2{EngineId: graphics})
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if log.EntriesCount == 0 || log.EntriesCount >= 200 {
		t.Fatalf("%d entries after 200 ms, want some and fewer than the ring", log.EntriesCount)
	}
	if log.SchedulerPolicy != nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT || log.Timeslice != 2_000_000 || log.AvgFactor != 0 {
		t.Errorf("log policy %d timeslice %d average factor %d", log.SchedulerPolicy, log.Timeslice, log.AvgFactor)
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
	log, _ = d.GetVgpuSchedulerLog_v2(nvml.VgpuSchedulerLogInfo_v2{EngineId: graphics})
	if log.EntriesCount != 200 || log.LogEntries[0].Timestamp <= prev {
		t.Errorf("after 2s: %d entries, oldest %d (last read %d): want a full ring that overran", log.EntriesCount, log.LogEntries[0].Timestamp, prev)
	}
}

func TestTelemetryRules(t *testing.T) {
	h, sc := simhost.Scenario(t, "quiet", nil)
	lib := h.NVML()
	lib.Init()
	mig, _ := lib.DeviceGetHandleByPciBusId(sc.Instance("mig-a").GPU)
	ts, _ := lib.DeviceGetHandleByPciBusId(sc.Instance("l4-a").GPU)
	if err := h.Advance(1500 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, ret := mig.GetVgpuSchedulerLog_v2(nvml.VgpuSchedulerLogInfo_v2{EngineId: graphics}); ret != nvml.ERROR_NOT_SUPPORTED {
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
	if err := h.SetWorkload("nonesuch", workload.Workload{Kind: workload.Steady}); !errors.Is(err, sim.ErrNoSuchDevice) {
		t.Errorf("workload on an unknown device: %v", err)
	}
}

// The _v2 scheduler calls round-trip: a frequency sets the time slice
// (1 s / frequency), an average factor turns ARR on, and a set of the
// state in force changes nothing. The temperature is served through
// nvmlDeviceGetTemperatureV's version 1.
func TestSchedulerV2AndTemperature(t *testing.T) {
	e := newEnv(t, nil)
	lib, d := e.lib, e.dev(t, sim.DefaultL4)
	get := func() nvml.VgpuSchedulerStateInfo_v2 {
		t.Helper()
		s, ret := d.GetVgpuSchedulerState_v2(nvml.VgpuSchedulerStateInfo_v2{EngineId: graphics})
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		return s
	}
	if s := get(); s.Timeslice != 2_000_000 || s.AvgFactor != 0 {
		t.Errorf("default state %+v, want the 2 ms slice without ARR", s)
	}
	for _, tc := range []struct {
		set  nvml.VgpuSchedulerState_v2
		want nvml.VgpuSchedulerStateInfo_v2
	}{
		{nvml.VgpuSchedulerState_v2{SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE, Frequency: 250},
			nvml.VgpuSchedulerStateInfo_v2{SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE, Timeslice: 4_000_000}},
		{nvml.VgpuSchedulerState_v2{SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE, AvgFactor: 3, Frequency: 100},
			nvml.VgpuSchedulerStateInfo_v2{SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE, AvgFactor: 3, Timeslice: 10_000_000}},
		{nvml.VgpuSchedulerState_v2{SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT},
			nvml.VgpuSchedulerStateInfo_v2{SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT, Timeslice: 2_000_000}},
	} {
		tc.set.EngineId, tc.want.EngineId = graphics, graphics
		for range 2 { // the second set is of the state in force
			if ret := d.SetVgpuSchedulerState_v2(&tc.set); ret != nvml.SUCCESS {
				t.Fatalf("set %+v: %v", tc.set, ret)
			}
			if s := get(); s != tc.want {
				t.Errorf("after set %+v: %+v, want %+v", tc.set, s, tc.want)
			}
		}
	}
	r, ok := d.(interface { // pkg/gpu/nvml's TemperatureReader
		TemperatureV1() (nvml.Temperature, nvml.Return)
	})
	if !ok {
		t.Fatal("the simulated device serves no nvmlDeviceGetTemperatureV")
	}
	temp, ret := r.TemperatureV1()
	if ret != nvml.SUCCESS || temp.Temperature < 20 || temp.Temperature > 100 || temp.SensorType != uint32(nvml.TEMPERATURE_GPU) {
		t.Errorf("temperature %+v (%v)", temp, ret)
	}
	for _, name := range []string{"nvmlDeviceGetVgpuSchedulerState_v2", "nvmlDeviceSetVgpuSchedulerState_v2", "nvmlDeviceGetVgpuSchedulerLog_v2"} {
		if err := lib.Extensions().LookupSymbol(name); err != nil {
			t.Errorf("the simulated library lacks %s: %v", name, err)
		}
	}
}

// A plain time slice set through the _v2 call (1 s / frequency, no ARR
// factor) is bounded by the time slice range the capabilities report,
// both ends legal, not by ARR's frequency range: 1 ms (1000 Hz) is
// settable, as the capabilities say, though ARR's highest is 960 Hz.
func TestSchedulerV2PlainSliceRange(t *testing.T) {
	e := newEnv(t, nil)
	d := e.dev(t, sim.DefaultL4)
	caps, ret := d.GetVgpuSchedulerCapabilities()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	set := func(freq uint32) nvml.Return {
		return d.SetVgpuSchedulerState_v2(&nvml.VgpuSchedulerState_v2{EngineId: graphics, SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE, Frequency: freq})
	}
	for _, f := range []uint32{1_000_000_000 / caps.MinTimeslice, 34, 167} {
		if ret := set(f); ret != nvml.SUCCESS {
			t.Fatalf("%d Hz (a %d ns slice, inside %d..%d): %v", f, 1_000_000_000/f, caps.MinTimeslice, caps.MaxTimeslice, ret)
		}
		s, ret := d.GetVgpuSchedulerState_v2(nvml.VgpuSchedulerStateInfo_v2{EngineId: graphics})
		if ret != nvml.SUCCESS || s.Timeslice != 1_000_000_000/f {
			t.Fatalf("after %d Hz: %+v, %v", f, s, ret)
		}
	}
	for _, f := range []uint32{1_000_000_000/caps.MinTimeslice + 1, 33} {
		if ret := set(f); ret != nvml.ERROR_INVALID_ARGUMENT {
			t.Fatalf("%d Hz (a %d ns slice, outside the range): %v, want INVALID_ARGUMENT", f, 1_000_000_000/f, ret)
		}
	}
}
