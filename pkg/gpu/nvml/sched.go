package nvml

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// The device-level vGPU scheduler (reference 5.3): capabilities, state,
// changing the policy, and the log of runs, through NVML's _v2 calls (the
// unversioned ones are deprecated). Every call is NOT_SUPPORTED
// (gpu.ErrNotSupported) with MIG on or without the vGPU manager; a policy
// change is NOT_SUPPORTED while a VM with a vGPU runs on the GPU.

// Scheduler policies, as NVML numbers them.
const (
	PolicyUnknown    = gonvml.VGPU_SCHEDULER_POLICY_UNKNOWN
	PolicyBestEffort = gonvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT
	PolicyEqualShare = gonvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE
	PolicyFixedShare = gonvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE
)

// SchedulerCaps is what the GPU's vGPU scheduler supports.
type SchedulerCaps struct {
	// Policies lists the supported policies (NVML numbers).
	Policies []uint32
	// MinTimeslice and MaxTimeslice bound the time slice.
	MinTimeslice, MaxTimeslice time.Duration
	// ARR: adaptive round robin is supported, with frequency and average
	// factor in the ranges below.
	ARR          bool
	MinFrequency uint32
	MaxFrequency uint32
	MinAvgFactor uint32
	MaxAvgFactor uint32
}

// Supports reports whether policy is among the supported ones.
func (c SchedulerCaps) Supports(policy uint32) bool {
	for _, p := range c.Policies {
		if p == policy {
			return true
		}
	}
	return false
}

// SchedulerState is the scheduler's policy and parameters.
type SchedulerState struct {
	Policy uint32
	// ARR enables adaptive round robin (Frequency, AvgFactor); otherwise
	// Timeslice applies (0: the driver's default).
	ARR       bool
	Timeslice time.Duration
	Frequency uint32
	AvgFactor uint32
}

// SchedulerLogEntry is one run of one vGPU's software runlist.
type SchedulerLogEntry struct {
	// Time is when the run ended (it was preempted or yielded), in the
	// driver's nanosecond clock.
	Time int64
	// Runlist identifies the vGPU (its runlist id; see VGPU.Runlist).
	Runlist uint32
	// Run is how long it ran; RunTotal its cumulative run time.
	Run, RunTotal time.Duration
	// Target is the time slice it was given.
	Target time.Duration
	// PreemptionTotal is the cumulative time spent preempting it.
	PreemptionTotal time.Duration
}

// Preempted reports whether the run ended because its slice was over
// (the vGPU had more work), not because it yielded.
func (e SchedulerLogEntry) Preempted() bool {
	return e.Target > 0 && e.Run >= e.Target-time.Microsecond
}

// SchedulerLog is the driver's ring of recent runs, oldest first.
type SchedulerLog struct {
	Policy  uint32
	Entries []SchedulerLogEntry
	// Full: the ring was full, so entries older than the first may be lost
	// unless the previous read saw the first one.
	Full bool
}

// Probe reads one GPU, keeping its device handle between calls (a lookup
// by UUID is a driver call of its own). A Probe is safe for one goroutine
// at a time; the share loop keeps one per GPU.
type Probe struct {
	b    *Backend
	uuid string

	mu  sync.Mutex
	dev gonvml.Device
	// gen is the session dev was looked up in (gate.gen): after a GPU
	// reset the handle is looked up again and the GPM samples dropped.
	gen          uint64
	gpm          map[int]*migSamples
	gpmChecked   bool
	gpmSupported bool
	tel          Telemetry
	telRead      bool
	// metrics is MIGActivity's GpmMetricsGet argument (19 KB), reused;
	// nil while none has come back from a call in time.
	metrics *gonvml.GpmMetricsGetType
}

// Probe returns a reader of the GPU with uuid.
func (b *Backend) Probe(uuid string) *Probe {
	return &Probe{b: b, uuid: uuid, gpm: map[int]*migSamples{}}
}

// UUID is the probed GPU's UUID.
func (p *Probe) UUID() string { return p.uuid }

// device returns the GPU's handle in the current session. Called inside
// the gate (the session cannot change under the caller).
func (p *Probe) device(ctx context.Context) (gonvml.Device, error) {
	gen := p.b.gate.generation()
	p.mu.Lock()
	if p.gen != gen {
		// The samples were the old session's: NVML freed them at its
		// Shutdown, so they are dropped, not freed again.
		p.dev, p.gen, p.gpm, p.gpmChecked = nil, gen, map[int]*migSamples{}, false
	}
	d := p.dev
	p.mu.Unlock()
	if d != nil {
		return d, nil
	}
	d, err := p.b.device(ctx, p.uuid)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.dev = d
	p.mu.Unlock()
	return d, nil
}

// onDevice is call for one NVML call on the probed GPU; a handle the
// driver no longer knows is dropped so the next call looks the GPU up again.
func onDevice[T any](ctx context.Context, p *Probe, op string, fn func(d gonvml.Device) (T, gonvml.Return)) (T, error) {
	d, err := p.device(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	v, err := call(ctx, p.b, op, func() (T, gonvml.Return) { return fn(d) })
	if errors.Is(err, gpu.ErrGPULost) || errors.Is(err, gpu.ErrDriverNotLoaded) {
		p.mu.Lock()
		p.dev = nil
		p.mu.Unlock()
	}
	if err != nil {
		return v, fmt.Errorf("GPU %s: %s: %w", p.uuid, op, err)
	}
	return v, nil
}

// SchedulerCapabilities reads what the GPU's vGPU scheduler supports.
func (p *Probe) SchedulerCapabilities(ctx context.Context) (SchedulerCaps, error) {
	ctx, release, herr := p.b.hold(ctx, "SchedulerCapabilities")
	if herr != nil {
		return SchedulerCaps{}, herr
	}
	defer release()
	c, err := onDevice(ctx, p, "GetVgpuSchedulerCapabilities", gonvml.Device.GetVgpuSchedulerCapabilities)
	if err != nil {
		return SchedulerCaps{}, err
	}
	out := SchedulerCaps{MinTimeslice: time.Duration(c.MinTimeslice), MaxTimeslice: time.Duration(c.MaxTimeslice), ARR: c.IsArrModeSupported != 0,
		MinFrequency: c.MinFrequencyForARR, MaxFrequency: c.MaxFrequencyForARR, MinAvgFactor: c.MinAvgFactorForARR, MaxAvgFactor: c.MaxAvgFactorForARR}
	for _, s := range c.SupportedSchedulers {
		if s != PolicyUnknown {
			out.Policies = append(out.Policies, s)
		}
	}
	return out, nil
}

// SchedulerState reads the scheduler's policy and parameters (the graphics
// engine's). The _v2 call reports no ARR flag: a non-zero average factor
// is ARR at work; and no frequency, which under ARR is 1 s / Timeslice.
func (p *Probe) SchedulerState(ctx context.Context) (SchedulerState, error) {
	ctx, release, herr := p.b.hold(ctx, "SchedulerState")
	if herr != nil {
		return SchedulerState{}, herr
	}
	defer release()
	if err := p.b.symbol("nvmlDeviceGetVgpuSchedulerState_v2"); err != nil {
		return SchedulerState{}, fmt.Errorf("GPU %s: %w", p.uuid, err)
	}
	s, err := onDevice(ctx, p, "GetVgpuSchedulerState_v2", func(d gonvml.Device) (gonvml.VgpuSchedulerStateInfo_v2, gonvml.Return) {
		return d.GetVgpuSchedulerState_v2(gonvml.VgpuSchedulerStateInfo_v2{EngineId: gonvml.VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS})
	})
	if err != nil {
		return SchedulerState{}, err
	}
	return SchedulerState{Policy: s.SchedulerPolicy, ARR: s.AvgFactor != 0, AvgFactor: s.AvgFactor, Timeslice: time.Duration(s.Timeslice)}, nil
}

// SliceFrequency is the frequency, in whole Hz, that SetSchedulerState
// asks for to get time slice ts: the _v2 call takes a frequency, not a
// slice, so a slice that is not 1 s / n comes back as the nearest one.
func SliceFrequency(ts time.Duration) uint32 {
	if ts <= 0 {
		return 0
	}
	return uint32(max(1, (time.Second+ts/2)/ts))
}

// SliceWithin is the time slice the _v2 call sets for ts inside a GPU's
// range lo..hi (gpu.SliceWithin: 1 s over a whole number of Hz).
func SliceWithin(ts, lo, hi time.Duration) time.Duration {
	return gpu.SliceWithin(ts, lo, hi)
}

// SetSchedulerState changes the scheduler. The driver accepts it only
// while no VM with a vGPU runs on the GPU: otherwise, and with MIG on, it
// fails with gpu.ErrNotSupported wrapping NOT_SUPPORTED. The _v2 call
// takes the policy, ARR's average factor and a frequency (0: the driver's
// default for each); a plain time slice is set as its frequency
// (SliceFrequency).
func (p *Probe) SetSchedulerState(ctx context.Context, s SchedulerState) error {
	ctx, release, herr := p.b.hold(ctx, "SetSchedulerState")
	if herr != nil {
		return herr
	}
	defer release()
	if err := p.b.symbol("nvmlDeviceSetVgpuSchedulerState_v2"); err != nil {
		return fmt.Errorf("GPU %s: %w", p.uuid, err)
	}
	set := gonvml.VgpuSchedulerState_v2{EngineId: gonvml.VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS, SchedulerPolicy: s.Policy}
	if s.ARR {
		set.AvgFactor, set.Frequency = s.AvgFactor, s.Frequency
	} else {
		set.Frequency = SliceFrequency(s.Timeslice)
	}
	_, err := onDevice(ctx, p, "SetVgpuSchedulerState_v2", func(d gonvml.Device) (struct{}, gonvml.Return) {
		return struct{}{}, d.SetVgpuSchedulerState_v2(&set)
	})
	return err
}

// SchedulerLog reads the scheduler's log of recent runs (the graphics
// engine's). The ring holds 200 entries: read it at least five times a
// second for a complete log.
func (p *Probe) SchedulerLog(ctx context.Context) (SchedulerLog, error) {
	ctx, release, herr := p.b.hold(ctx, "SchedulerLog")
	if herr != nil {
		return SchedulerLog{}, herr
	}
	defer release()
	if err := p.b.symbol("nvmlDeviceGetVgpuSchedulerLog_v2"); err != nil {
		return SchedulerLog{}, fmt.Errorf("GPU %s: %w", p.uuid, err)
	}
	l, err := onDevice(ctx, p, "GetVgpuSchedulerLog_v2", func(d gonvml.Device) (gonvml.VgpuSchedulerLogInfo_v2, gonvml.Return) {
		return d.GetVgpuSchedulerLog_v2(gonvml.VgpuSchedulerLogInfo_v2{EngineId: gonvml.VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS})
	})
	if err != nil {
		return SchedulerLog{}, err
	}
	return schedulerLogOf(l), nil
}

// schedulerLogOf is a _v2 log, the device's or a GPU instance's.
func schedulerLogOf(l gonvml.VgpuSchedulerLogInfo_v2) SchedulerLog {
	n := min(int(l.EntriesCount), len(l.LogEntries))
	out := SchedulerLog{Policy: l.SchedulerPolicy, Full: n == len(l.LogEntries), Entries: make([]SchedulerLogEntry, 0, n)}
	for _, e := range l.LogEntries[:n] {
		out.Entries = append(out.Entries, SchedulerLogEntry{Time: int64(e.Timestamp), Runlist: e.SwRunlistId, Run: time.Duration(e.TimeRun),
			RunTotal: time.Duration(e.TimeRunTotal), Target: time.Duration(e.TargetTimeSlice), PreemptionTotal: time.Duration(e.CumulativePreemptionTime)})
	}
	return out
}
