package nvml_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
)

// lacking is a library's symbol lookup that finds every function but names.
func lacking(names ...string) *mock.ExtendedInterface {
	return &mock.ExtendedInterface{LookupSymbolFunc: func(name string) error {
		if slices.Contains(names, name) {
			return fmt.Errorf("undefined symbol: %s", name)
		}
		return nil
	}}
}

// The scheduler goes through NVML's _v2 calls, on the graphics engine,
// but for a plain time slice: ARR is sent as its factor and frequency, a
// time slice (without ARR) with the unversioned call, which takes it in ns
// as it is (1 ms and 30 ms, the range's ends, 6 ms exactly; as a _v2
// frequency 30 ms and 6 ms cannot be said), or, on a library without that
// call, as its frequency; the state and log come back decoded.
func TestSchedulerV2Calls(t *testing.T) {
	for _, v1 := range []bool{true, false} {
		t.Run(fmt.Sprintf("unversioned=%v", v1), func(t *testing.T) { testSchedulerCalls(t, v1) })
	}
}

func testSchedulerCalls(t *testing.T, v1 bool) {
	lib, dev := &mock.Interface{}, &mock.Device{}
	if v1 {
		lib.ExtensionsFunc = func() gonvml.ExtendedInterface { return lacking() }
	} else {
		lib.ExtensionsFunc = func() gonvml.ExtendedInterface { return lacking("nvmlDeviceSetVgpuSchedulerState") }
	}
	var sets []gonvml.VgpuSchedulerState_v2
	var v1sets []gonvml.VgpuSchedulerSetState
	dev.SetVgpuSchedulerState_v2Func = func(s *gonvml.VgpuSchedulerState_v2) gonvml.Return {
		sets = append(sets, *s)
		return gonvml.SUCCESS
	}
	dev.SetVgpuSchedulerStateFunc = func(s *gonvml.VgpuSchedulerSetState) gonvml.Return {
		v1sets = append(v1sets, *s)
		return gonvml.SUCCESS
	}
	dev.GetVgpuSchedulerState_v2Func = func(in gonvml.VgpuSchedulerStateInfo_v2) (gonvml.VgpuSchedulerStateInfo_v2, gonvml.Return) {
		if in.EngineId != gonvml.VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS {
			return in, gonvml.ERROR_INVALID_ARGUMENT
		}
		in.SchedulerPolicy, in.AvgFactor, in.Timeslice = nvmlb.PolicyFixedShare, 4, 10_000_000
		return in, gonvml.SUCCESS
	}
	dev.GetVgpuSchedulerLog_v2Func = func(in gonvml.VgpuSchedulerLogInfo_v2) (gonvml.VgpuSchedulerLogInfo_v2, gonvml.Return) {
		if in.EngineId != gonvml.VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS {
			return in, gonvml.ERROR_INVALID_ARGUMENT
		}
		in.SchedulerPolicy, in.EntriesCount = nvmlb.PolicyBestEffort, 1
		in.LogEntries[0] = gonvml.VgpuSchedulerLogEntry_v2{Timestamp: 5, TimeRun: 2_000_000, TimeRunTotal: 7_000_000, SwRunlistId: 3, TargetTimeSlice: 2_000_000}
		return in, gonvml.SUCCESS
	}
	b, _ := fakeBackend(lib, dev)
	p := b.Probe("GPU-fake")
	ctx := context.Background()

	if err := p.SetSchedulerState(ctx, nvmlb.SchedulerState{Policy: nvmlb.PolicyFixedShare, Timeslice: 4 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := p.SetSchedulerState(ctx, nvmlb.SchedulerState{Policy: nvmlb.PolicyEqualShare, ARR: true, AvgFactor: 2, Frequency: 120}); err != nil {
		t.Fatal(err)
	}
	if err := p.SetSchedulerState(ctx, nvmlb.SchedulerState{Policy: nvmlb.PolicyBestEffort}); err != nil {
		t.Fatal(err)
	}
	for _, ts := range []time.Duration{time.Millisecond, 6 * time.Millisecond, 30 * time.Millisecond} {
		if err := p.SetSchedulerState(ctx, nvmlb.SchedulerState{Policy: nvmlb.PolicyEqualShare, Timeslice: ts}); err != nil {
			t.Fatal(err)
		}
	}
	g := uint32(gonvml.VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS)
	want := []gonvml.VgpuSchedulerState_v2{
		{EngineId: g, SchedulerPolicy: nvmlb.PolicyFixedShare, Frequency: 250},
		{EngineId: g, SchedulerPolicy: nvmlb.PolicyEqualShare, AvgFactor: 2, Frequency: 120},
		{EngineId: g, SchedulerPolicy: nvmlb.PolicyBestEffort},
		{EngineId: g, SchedulerPolicy: nvmlb.PolicyEqualShare, Frequency: 1000},
		{EngineId: g, SchedulerPolicy: nvmlb.PolicyEqualShare, Frequency: 167},
		{EngineId: g, SchedulerPolicy: nvmlb.PolicyEqualShare, Frequency: 33},
	}
	if v1 {
		want = want[1:2]
		slice := func(policy uint32, ns uint32) gonvml.VgpuSchedulerSetState {
			s := gonvml.VgpuSchedulerSetState{SchedulerPolicy: policy, EnableARRMode: gonvml.VGPU_SCHEDULER_ARR_DISABLE}
			s.SchedulerParams[0], s.SchedulerParams[1], s.SchedulerParams[2], s.SchedulerParams[3] = byte(ns), byte(ns>>8), byte(ns>>16), byte(ns>>24)
			return s
		}
		wantV1 := []gonvml.VgpuSchedulerSetState{
			slice(nvmlb.PolicyFixedShare, 4_000_000), slice(nvmlb.PolicyBestEffort, 0),
			slice(nvmlb.PolicyEqualShare, 1_000_000), slice(nvmlb.PolicyEqualShare, 6_000_000), slice(nvmlb.PolicyEqualShare, 30_000_000),
		}
		if !slices.Equal(v1sets, wantV1) {
			t.Errorf("unversioned sets %+v, want %+v", v1sets, wantV1)
		}
	} else if len(v1sets) != 0 {
		t.Errorf("the unversioned call was made though the library lacks it: %+v", v1sets)
	}
	if !slices.Equal(sets, want) {
		t.Errorf("sets %+v, want %+v", sets, want)
	}
	st, err := p.SchedulerState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (nvmlb.SchedulerState{Policy: nvmlb.PolicyFixedShare, ARR: true, AvgFactor: 4, Timeslice: 10 * time.Millisecond}); st != want {
		t.Errorf("state %+v, want %+v", st, want)
	}
	l, err := p.SchedulerLog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Entries) != 1 || l.Entries[0].Runlist != 3 || l.Entries[0].RunTotal != 7*time.Millisecond || !l.Entries[0].Preempted() || l.Full {
		t.Errorf("log %+v", l)
	}
}

// A driver whose NVML lacks the _v2 calls is never asked them (calling a
// missing symbol would end the process): each is gpu.ErrNotSupported,
// naming the function.
func TestSchedulerV2MissingFromDriver(t *testing.T) {
	lib, dev := &mock.Interface{}, &mock.Device{}
	lib.ExtensionsFunc = func() gonvml.ExtendedInterface {
		return lacking("nvmlDeviceGetVgpuSchedulerState_v2", "nvmlDeviceSetVgpuSchedulerState_v2", "nvmlDeviceGetVgpuSchedulerLog_v2", "nvmlDeviceSetVgpuSchedulerState")
	}
	// dev has no _v2 functions set: the mock panics if one is called.
	b, _ := fakeBackend(lib, dev)
	p := b.Probe("GPU-fake")
	ctx := context.Background()
	for name, err := range map[string]error{
		"nvmlDeviceGetVgpuSchedulerState_v2": func() error { _, err := p.SchedulerState(ctx); return err }(),
		"nvmlDeviceSetVgpuSchedulerState_v2": p.SetSchedulerState(ctx, nvmlb.SchedulerState{Policy: nvmlb.PolicyFixedShare}),
		"nvmlDeviceGetVgpuSchedulerLog_v2":   func() error { _, err := p.SchedulerLog(ctx); return err }(),
	} {
		if !errors.Is(err, gpu.ErrNotSupported) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want ErrNotSupported naming it", name, err)
		}
	}
}

func TestSliceFrequency(t *testing.T) {
	for ts, want := range map[time.Duration]uint32{0: 0, time.Millisecond: 1000, 2 * time.Millisecond: 500, 3 * time.Millisecond: 333, 30 * time.Millisecond: 33, 2 * time.Second: 1} {
		if got := nvmlb.SliceFrequency(ts); got != want {
			t.Errorf("SliceFrequency(%v) = %d, want %d", ts, got, want)
		}
	}
}
