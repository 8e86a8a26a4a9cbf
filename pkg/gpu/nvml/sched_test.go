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

// The scheduler goes through NVML's _v2 calls, on the graphics engine: a
// time slice is sent as its frequency, ARR as its factor and frequency,
// and the state and log come back decoded.
func TestSchedulerV2Calls(t *testing.T) {
	lib, dev := &mock.Interface{}, &mock.Device{}
	lib.ExtensionsFunc = func() gonvml.ExtendedInterface { return lacking() }
	var sets []gonvml.VgpuSchedulerState_v2
	dev.SetVgpuSchedulerState_v2Func = func(s *gonvml.VgpuSchedulerState_v2) gonvml.Return {
		sets = append(sets, *s)
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
	g := uint32(gonvml.VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS)
	want := []gonvml.VgpuSchedulerState_v2{
		{EngineId: g, SchedulerPolicy: nvmlb.PolicyFixedShare, Frequency: 250},
		{EngineId: g, SchedulerPolicy: nvmlb.PolicyEqualShare, AvgFactor: 2, Frequency: 120},
		{EngineId: g, SchedulerPolicy: nvmlb.PolicyBestEffort},
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
		return lacking("nvmlDeviceGetVgpuSchedulerState_v2", "nvmlDeviceSetVgpuSchedulerState_v2", "nvmlDeviceGetVgpuSchedulerLog_v2")
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

// A time slice goes to the _v2 call as a whole number of Hz: the nearest
// settable slice, moved inside the GPU's range when the nearest is not.
func TestSliceWithin(t *testing.T) {
	lo, hi := time.Millisecond, 30*time.Millisecond
	for ts, want := range map[time.Duration]time.Duration{
		0:                         0,
		time.Millisecond:          time.Millisecond, // 1000 Hz
		2 * time.Millisecond:      2 * time.Millisecond,
		6 * time.Millisecond:      time.Second / 167,
		30 * time.Millisecond:     time.Second / 34, // 33 Hz would be 30.3 ms, over the range
		1999 * time.Microsecond:   2 * time.Millisecond,
		999500 * time.Nanosecond:  time.Millisecond, // 1001 Hz would be under it
		29900 * time.Microsecond:  time.Second / 34,
		10 * time.Millisecond:     10 * time.Millisecond,
		30*time.Millisecond + 1e3: time.Second / 34,
	} {
		got := nvmlb.SliceWithin(ts, lo, hi)
		if got != want {
			t.Errorf("SliceWithin(%v) = %v, want %v", ts, got, want)
		}
		if ts != 0 && (got < lo || got > hi) {
			t.Errorf("SliceWithin(%v) = %v, outside %v..%v", ts, got, lo, hi)
		}
	}
}
