// Package workload is the simulated GPUs' performance model: each vGPU or
// MIG instance submits work by its Workload, and each GPU serves it by the
// active vGPU scheduler policy (time-sliced GPUs) or on the instance's own
// slices at the clocks the shared power limit allows (MIG). The model keeps
// what a driver would report (scheduler log, utilization samples, power,
// clocks, clock event reasons) and the ground truth (Truth) the tests
// compare the share loop's measurements with.
//
// It models performance, not the driver: pkg/gpu/sim keeps the hardware and
// driver state, describes each GPU to the engine as a GPU (its running
// instances with their workloads and shares, its policy, time slice and
// power limit) and serves the NVML calls from what the engine reports.
// pkg/gpu/sim imports it, and so do those who drive the simulator's
// workloads and read its truth: cmd/vgpud's sim commands, bench/, test
// harnesses and tests.
//
// Imports: nothing from vgpud.
package workload

import (
	"sort"
	"time"
)

// The model runs on a simulated clock: the wall clock by default (so a
// daemon on the simulated host sees counters move), or a manual one that
// MoveClock moves, faster than real time, for tests. An Engine lives in
// the simulator's process and not in its state file: like the driver's
// scheduler it starts afresh with the process.
//
// Scheduler model, per policy (the timeslice T is the GPU's):
//
//   - BEST_EFFORT: work-conserving round robin over the vGPUs with a kernel
//     queued. A vGPU runs whole kernels and is preempted at the first kernel
//     boundary after T, so a neighbour with long kernels overruns its slice.
//   - EQUAL_SHARE: strict round robin, one slot of T per running vGPU;
//     preemption at the slot end (compute preemption), idle time is not
//     given away.
//   - FIXED_SHARE: strict slots sized by each vGPU's fixed share (1/max
//     instances of its type, framebuffer share in mixed-size mode); the
//     shares of absent vGPUs stay idle.
//
// Each switch between vGPUs costs SwitchCost of GPU time. A vGPU's queued
// work is bounded by BacklogCap; work beyond it is lost.

// maxCatchUp bounds how much wall-clock time one advance simulates: a
// daemon that did not look for a while sees the last maxCatchUp only.
const maxCatchUp = 5 * int64(time.Second)

// ManualEpoch is where a manual clock starts (NewManual): a fixed instant,
// 2026-01-01 UTC, so that scenario runs are reproducible.
var ManualEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

// GPU is what the engine needs to know of one GPU: its identity and power
// figures, how its scheduler shares it, and the instances that submit work
// to it.
//
// The engine keeps the GPU it is handed and reads it again only when it is
// handed another one, so that an unchanged GPU costs nothing: a caller must
// not change a GPU it has passed, and passes a new one when anything in it
// changed. A new GPU equal to the last one changes nothing.
type GPU struct {
	// UUID names the GPU: the engine keeps one model per UUID.
	UUID string
	// Power are the board's power and clock figures (PowerOf).
	Power Power
	// Lost: the GPU fell off the bus, and its model stands still.
	Lost bool
	// MIG: the GPU is in MIG mode, and its instances run on their own
	// slices.
	MIG bool
	// CapW is the power limit in force, in watts.
	CapW float64
	// Policy is the vGPU scheduler's policy (nvml.VGPU_SCHEDULER_POLICY_*)
	// and Timeslice its time slice in ns; both matter only without MIG.
	Policy    uint32
	Timeslice int64
	// Instances are the vGPUs and MIG instances running on the GPU.
	Instances []Instance
}

// Instance is one vGPU or MIG GPU instance running on a GPU.
type Instance struct {
	// Key names the instance for as long as it exists, across VM restarts;
	// Truth reports it by Key.
	Key string
	// Handle is the vGPU's NVML handle (0 for a MIG GPU instance). The
	// time-sliced scheduler serves the vGPUs in handle order.
	Handle uint32
	// GI is the GPU instance it runs on; -1 when time-sliced.
	GI int
	// Share is a time-sliced vGPU's fixed share of the GPU (FIXED_SHARE),
	// or the fraction of the GPU's compute slices its GPU instance holds.
	Share float64
	// Workload is what it submits; the zero Workload submits nothing.
	Workload Workload
}

// Engine is the workload model of one simulated host's GPUs. It is not
// safe for concurrent use: the simulator calls it under its lock.
type Engine struct {
	cal    Calibration
	manual bool
	now    int64
	gpus   map[string]*GPURun
	truth  map[string]*instTruth
}

// New returns an engine with the constants c, on the wall clock.
func New(c Calibration) *Engine {
	return &Engine{cal: c, gpus: map[string]*GPURun{}, truth: map[string]*instTruth{}}
}

// NewManual returns an engine with the constants c on a manual clock that
// stands at start (ns since the Unix epoch) until MoveClock moves it.
func NewManual(c Calibration, start int64) *Engine {
	e := New(c)
	e.manual, e.now = true, start
	return e
}

// Calibration returns the engine's constants.
func (e *Engine) Calibration() Calibration { return e.cal }

// Manual reports whether the engine runs on a manual clock.
func (e *Engine) Manual() bool { return e.manual }

// Now is the engine's current time, in ns since the Unix epoch.
func (e *Engine) Now() int64 {
	if e.manual {
		return e.now
	}
	return time.Now().UnixNano()
}

// MoveClock moves a manual clock by d; it reports false, and moves
// nothing, on the wall clock. The GPUs' models catch up at their next
// Advance.
func (e *Engine) MoveClock(d time.Duration) bool {
	if !e.manual {
		return false
	}
	e.now += int64(d)
	return true
}

// Advance brings every GPU's model to the current time; it returns that
// time.
func (e *Engine) Advance(gpus []*GPU) int64 {
	now := e.Now()
	for _, g := range gpus {
		e.advanceGPU(g, now)
	}
	return now
}

// AdvanceGPU brings one GPU's model to the current time and returns it.
func (e *Engine) AdvanceGPU(g *GPU) *GPURun {
	return e.advanceGPU(g, e.Now())
}

func (e *Engine) advanceGPU(g *GPU, to int64) *GPURun {
	r := e.gpus[g.UUID]
	if r == nil {
		r = &GPURun{e: e, t: to, pm: g.Power, cf: 1, insts: map[string]*instRun{},
			gis: map[int]*giRun{}, bucketStart: to - to%bucketNs}
		e.gpus[g.UUID] = r
	}
	if !e.manual && to-r.t > maxCatchUp {
		r.t = to - maxCatchUp
		r.bucketStart = r.t - r.t%bucketNs
	}
	r.sync(g)
	if g.Lost || to <= r.t {
		if to > r.t {
			r.t = to
		}
		return r
	}
	if r.mig {
		r.runMIG(to)
	} else {
		r.runTS(to)
	}
	return r
}

// instTruth is what an instance really got, cumulative, kept across VM
// restarts by workload key.
type instTruth struct {
	gpu      string
	gi       int
	handle   uint32
	demand   float64 // ns of work submitted (at full clock)
	work     float64 // ns of work served (at full clock)
	run      float64 // ns the instance ran (time-sliced) or its slices were busy (MIG)
	dropped  float64 // ns of work lost to the backlog bound
	throttle [nReasons]float64
	runs     int64
	preempts int64
	active   bool
}

// instRun is one running instance in a GPU's model.
type instRun struct {
	key    string
	handle uint32
	gi     int
	share  float64 // fixed share (time-sliced) or slice fraction (MIG)
	w      Workload
	level  float64 // current demand
	next   int64   // next trace change
	rng    uint64
	on     bool

	backlog      float64 // queued work, ns at full clock
	runTotal     int64
	preemptTotal int64
	bucketRun    float64
	samples      []utilSample
	t            *instTruth
}

type giRun struct {
	busy, dram float64 // cumulative ns
}

// GPURun is one GPU's model as it runs: what the driver would report of
// the GPU (see telemetry.go) and the ground truth of its instances.
type GPURun struct {
	e     *Engine
	t     int64
	pm    Power
	mig   bool
	capW  float64
	insts map[string]*instRun
	order []*instRun
	gis   map[int]*giRun

	// synced is the configuration last read, to notice changes cheaply.
	synced    *GPU
	policy    uint32
	timeslice int64

	// power and clocks
	cf       float64
	powerW   float64
	reasons  uint64
	energyMJ float64
	busy     float64 // cumulative whole-GPU busy ns
	memBusy  float64
	throttle [nReasons]float64

	bucketStart int64
	bBusy, bMem float64
	buckets     []gpuBucket

	// MIG segment cache
	segValid bool
	segBusy  map[int]float64 // per GI busy fraction
	segWork  map[int]float64 // per GI work rate
	segDem   map[int]float64 // per GI demand

	sch tsSched
	log schedLog
}

// sync reconciles the GPU's model with its configuration: running
// instances, workloads, policy, power cap. The GPU last read costs
// nothing.
func (r *GPURun) sync(g *GPU) {
	if r.synced == g {
		return
	}
	r.synced = g
	mig := g.MIG
	capW := g.CapW
	ts := g.Timeslice
	if mig != r.mig || capW != r.capW || g.Policy != r.policy || ts != r.timeslice {
		r.endRun()
		r.sch = tsSched{}
		r.mig, r.capW, r.policy, r.timeslice = mig, capW, g.Policy, ts
		r.segValid = false
	}
	want := map[string]*instRun{}
	for _, in := range g.Instances {
		key := in.Key
		x := r.insts[key]
		if x == nil {
			x = &instRun{key: key, gi: in.GI}
		}
		x.handle, x.gi, x.share = in.Handle, in.GI, in.Share
		if x.w != in.Workload || x.t == nil {
			x.w = in.Workload
			x.initTrace(r.t)
			r.segValid = false
			if r.sch.phase == phaseIdle {
				r.sch.phase = phaseNone // new demand: the wake-up time is stale
			}
		}
		if x.t == nil {
			x.t = r.e.truth[key]
			if x.t == nil {
				x.t = &instTruth{}
				r.e.truth[key] = x.t
			}
		}
		x.t.gpu, x.t.gi, x.t.handle, x.t.active = g.UUID, in.GI, in.Handle, true
		want[key] = x
	}
	changed := len(want) != len(r.insts)
	for k, x := range r.insts {
		if want[k] == nil {
			if r.sch.runner == x {
				r.endRun()
			}
			x.t.active = false
			changed = true
		}
	}
	r.insts = want
	if changed {
		r.order = r.order[:0]
		for _, x := range want {
			r.order = append(r.order, x)
		}
		sort.Slice(r.order, func(i, j int) bool {
			if r.order[i].handle != r.order[j].handle {
				return r.order[i].handle < r.order[j].handle
			}
			return r.order[i].key < r.order[j].key
		})
		r.sch.slots = nil
		r.segValid = false
		if r.sch.runner != nil && want[r.sch.runner.key] == nil {
			r.sch = tsSched{}
		}
		if r.sch.phase == phaseIdle {
			r.sch.phase = phaseNone
		}
	}
}
