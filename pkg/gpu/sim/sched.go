package sim

import (
	"math"
	"sort"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// This file is the simulated GPUs' workload model and vGPU scheduler: each
// vGPU or MIG instance submits work by its Workload, and the GPU serves it
// by the active scheduler policy (time-sliced GPUs) or on the instance's
// own slices at the clocks the shared power limit allows (MIG). The model
// keeps what a driver would report (scheduler log, utilization samples,
// power, clocks, clock event reasons) and the ground truth the tests
// compare the share loop's measurements with.
//
// It runs on a simulated clock: the wall clock by default (so a daemon on
// the simulated host sees counters move), or a manual one that Advance
// moves, faster than real time, for tests. Its state lives in the Host
// (one per process) and not in state.json: like the driver's scheduler it
// starts afresh with the process.
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

// Clock event reasons the model raises, in the order of ReasonName.
const (
	reasonIdle     = 0 // ClocksEventReasonGpuIdle
	reasonPowerCap = 1 // ClocksEventReasonSwPowerCap
	nReasons       = 2
)

var reasonBits = [nReasons]uint64{nvml.ClocksEventReasonGpuIdle, nvml.ClocksEventReasonSwPowerCap}

// maxCatchUp bounds how much wall-clock time one advance simulates: a
// daemon that did not look for a while sees the last maxCatchUp only.
const maxCatchUp = 5 * int64(time.Second)

// bucketNs is the utilization sampling period; samplesKept how many are kept.
const (
	bucketNs    = int64(100 * time.Millisecond)
	samplesKept = 20
	logSize     = len(nvml.VgpuSchedulerLog{}.LogEntries)
)

// manualEpoch is where a manual clock starts: a fixed instant, so that
// scenario runs are reproducible.
var manualEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

type engine struct {
	cal    Calibration
	manual bool
	now    int64
	gpus   map[string]*gpuRun
	truth  map[string]*instTruth
}

func newEngine() *engine {
	return &engine{cal: DefaultCalibration(), gpus: map[string]*gpuRun{}, truth: map[string]*instTruth{}}
}

// engine returns the host's workload model. Callers hold h.mu.
func (h *Host) engine() *engine {
	if h.eng == nil {
		h.eng = newEngine()
	}
	return h.eng
}

func (e *engine) clock() int64 {
	if e.manual {
		return e.now
	}
	return time.Now().UnixNano()
}

// advance brings every GPU's model to the current time; it returns that time.
func (e *engine) advance(st *state) int64 {
	now := e.clock()
	for _, g := range st.GPUs {
		e.advanceGPU(st, g, now)
	}
	return now
}

// at brings one GPU's model to the current time and returns it.
func (e *engine) at(st *state, g *gpuState) *gpuRun {
	now := e.clock()
	return e.advanceGPU(st, g, now)
}

func (e *engine) advanceGPU(st *state, g *gpuState, to int64) *gpuRun {
	r := e.gpus[g.UUID]
	if r == nil {
		r = &gpuRun{e: e, uuid: g.UUID, t: to, pm: powerOf(g.model), cf: 1, insts: map[string]*instRun{},
			gis: map[int]*giRun{}, bucketStart: to - to%bucketNs}
		e.gpus[g.UUID] = r
	}
	if !e.manual && to-r.t > maxCatchUp {
		r.t = to - maxCatchUp
		r.bucketStart = r.t - r.t%bucketNs
	}
	r.sync(st, g)
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

type utilSample struct {
	ts      uint64 // µs
	sm, mem uint32 // percent
}

type giRun struct {
	busy, dram float64 // cumulative ns
}

type gpuRun struct {
	e     *engine
	uuid  string
	t     int64
	pm    powerModel
	mig   bool
	capW  float64
	insts map[string]*instRun
	order []*instRun
	gis   map[int]*giRun

	// configuration last synced, to notice changes cheaply.
	syncedState *state
	syncedGen   uint64
	policy      uint32
	timeslice   int64

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

type gpuBucket struct {
	t         int64
	busy, mem float64 // fractions of the bucket
	energyMJ  float64 // at the bucket's end
}

// schedLog is the driver's ring of the last 200 scheduler entries.
type schedLog struct {
	entries [logSize]nvml.VgpuSchedulerLogEntry
	head    int // index of the oldest entry
	n       int
	total   uint64
}

func (l *schedLog) add(e nvml.VgpuSchedulerLogEntry) {
	if l.n < logSize {
		l.entries[(l.head+l.n)%logSize] = e
		l.n++
	} else {
		l.entries[l.head] = e
		l.head = (l.head + 1) % logSize
	}
	l.total++
}

// sync reconciles the GPU's model with the state: running instances,
// workloads, policy, power cap. Unchanged state (same generation) costs
// nothing.
func (r *gpuRun) sync(st *state, g *gpuState) {
	if r.syncedState == st && r.syncedGen == st.Generation {
		return
	}
	r.syncedState, r.syncedGen = st, st.Generation
	mig := g.MIGCurrent
	capW := g.capW()
	ts := int64(g.timeslice())
	if mig != r.mig || capW != r.capW || g.Sched.Policy != r.policy || ts != r.timeslice {
		r.endRun()
		r.sch = tsSched{}
		r.mig, r.capW, r.policy, r.timeslice = mig, capW, g.Sched.Policy, ts
		r.segValid = false
	}
	want := map[string]*instRun{}
	add := func(key string, handle uint32, gi int, share float64, w *Workload) {
		x := r.insts[key]
		if x == nil {
			x = &instRun{key: key, gi: gi}
		}
		x.handle, x.gi, x.share = handle, gi, share
		var wl Workload
		if w != nil {
			wl = *w
		}
		if x.w != wl || x.t == nil {
			x.w = wl
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
		x.t.gpu, x.t.gi, x.t.handle, x.t.active = g.UUID, gi, handle, true
		want[key] = x
	}
	keyOf := func(v *vgpu) string {
		for _, f := range g.VFs {
			if f.VGPU == v {
				return f.PCI
			}
		}
		for _, m := range g.Mdevs {
			if m.VGPU == v {
				return m.UUID
			}
		}
		return ""
	}
	if mig {
		total := 1.0
		if g.model.MIG != nil && g.model.MIG.ComputeSlices > 0 {
			total = float64(g.model.MIG.ComputeSlices)
		}
		for _, x := range g.GIs {
			p := giProfileOf(g, x)
			share := 0.0
			if p != nil {
				share = float64(p.ComputeSlices) / total
			}
			if w := st.Workloads[migKey(g.UUID, x.ID)]; w != nil {
				add(migKey(g.UUID, x.ID), 0, x.ID, share, w)
			}
			for _, v := range g.vgpusOnGI(x.ID) {
				if k := keyOf(v); v.VM != "" && k != "" && st.Workloads[k] != nil {
					add(k, v.Handle, x.ID, share, st.Workloads[k])
				}
			}
		}
	} else {
		for _, v := range g.activeVGPUs() {
			if v.GI >= 0 {
				continue
			}
			k := keyOf(v)
			if k == "" {
				continue
			}
			add(k, v.Handle, -1, fixedShare(g, v), st.Workloads[k])
		}
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

// fixedShare is the share FIXED_SHARE gives a time-sliced vGPU: 1/max
// instances of its type, or its framebuffer's share of the GPU in
// mixed-size mode.
func fixedShare(g *gpuState, v *vgpu) float64 {
	t := g.typeOf(v)
	if t == nil {
		return 0
	}
	if g.Heterogeneous && g.model.MemoryMiB > 0 {
		return float64(t.FramebufferMiB) / float64(g.model.MemoryMiB)
	}
	if t.MaxInstances > 0 {
		return 1 / float64(t.MaxInstances)
	}
	return 0
}

// --- demand traces ---

func splitmix(x *uint64) uint64 {
	*x += 0x9e3779b97f4a7c15
	z := *x
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func fnv(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// initTrace positions the instance's demand trace at time t. A bursty
// trace is generated from the workload's start, so it does not depend on
// when the model first looked at it.
func (x *instRun) initTrace(t int64) {
	x.level, x.next = x.w.Demand, math.MaxInt64
	if x.w.Kind != WorkloadBursty {
		return
	}
	x.rng = x.w.Seed ^ fnv(x.key)
	x.on = false
	x.next = x.w.StartNs
	for x.next <= t {
		x.step()
	}
}

func (x *instRun) step() {
	x.on = !x.on
	mean := float64(x.w.PeriodNs) * (1 - x.w.Duty)
	x.level = 0
	if x.on {
		mean = float64(x.w.PeriodNs) * x.w.Duty
		x.level = x.w.Demand / x.w.Duty
	}
	u := (float64(splitmix(&x.rng)>>11) + 0.5) / (1 << 53)
	d := int64(-math.Log(u) * mean)
	if d < int64(time.Millisecond) {
		d = int64(time.Millisecond)
	}
	x.next += d
}

func (r *gpuRun) nextTrace() int64 {
	n := int64(math.MaxInt64)
	for _, x := range r.order {
		if x.next < n {
			n = x.next
		}
	}
	return n
}

// traceStep applies the trace changes due at r.t and reports whether any
// demand changed.
func (r *gpuRun) traceStep() bool {
	changed := false
	for _, x := range r.order {
		for x.next <= r.t {
			x.step()
			r.segValid = false
			changed = true
		}
	}
	return changed
}

// --- utilization buckets ---

func (r *gpuRun) nextBucket() int64 { return r.bucketStart + bucketNs }

func (r *gpuRun) flushBuckets() {
	for r.t >= r.bucketStart+bucketNs {
		end := r.bucketStart + bucketNs
		r.buckets = append(r.buckets, gpuBucket{t: end, busy: r.bBusy / float64(bucketNs), mem: r.bMem / float64(bucketNs), energyMJ: r.energyMJ})
		if len(r.buckets) > samplesKept {
			r.buckets = r.buckets[len(r.buckets)-samplesKept:]
		}
		for _, x := range r.order {
			sm := uint32(math.Round(100 * x.bucketRun / float64(bucketNs)))
			x.samples = append(x.samples, utilSample{ts: uint64(end / 1000), sm: sm, mem: uint32(math.Round(float64(sm) * memPerSM))})
			if len(x.samples) > samplesKept {
				x.samples = x.samples[len(x.samples)-samplesKept:]
			}
			x.bucketRun = 0
		}
		r.bBusy, r.bMem = 0, 0
		r.bucketStart = end
	}
}

// memPerSM is how busy the memory is per unit of SM activity.
const memPerSM = 0.55

// account adds dt of GPU activity to the power, clock and utilization
// counters: busy is the fraction of the GPU busy, watts the draw.
func (r *gpuRun) account(dt float64, busy, watts float64, throttled bool) {
	r.powerW = watts
	r.energyMJ += watts * dt / 1e6
	r.busy += busy * dt
	r.memBusy += busy * memPerSM * dt
	r.bBusy += busy * dt
	r.bMem += busy * memPerSM * dt
	r.reasons = 0
	if throttled {
		r.reasons |= nvml.ClocksEventReasonSwPowerCap
		r.throttle[reasonPowerCap] += dt
	}
	if busy == 0 {
		r.reasons |= nvml.ClocksEventReasonGpuIdle
		r.throttle[reasonIdle] += dt
	}
}

// --- time-sliced scheduler ---

type tsPhase int

const (
	phaseNone   tsPhase = iota // decide at the current time
	phaseIdle                  // nothing runnable (best effort) until wake
	phaseSwitch                // context switch to runner until switchEnd
	phaseRun                   // runner runs
	phaseSlot                  // strict slot with nobody running until slotEnd
)

type tsSlot struct {
	inst *instRun // nil: an idle slot (the share of absent vGPUs)
	len  int64
}

type tsSched struct {
	phase     tsPhase
	runner    *instRun
	last      *instRun // context last on the GPU
	wake      int64
	switchEnd int64
	runStart  int64
	kernelEnd int64
	runAcc    float64 // ns run in this run (strict trickle counts partially)
	target    int64
	cf        float64
	slotEnd   int64
	slots     []tsSlot
	slot      int
	cursor    int
}

func (r *gpuRun) strict() bool {
	return r.policy == nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE || r.policy == nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE
}

func (r *gpuRun) kernel(x *instRun) float64 {
	if x.w.KernelNs > 0 {
		return float64(x.w.KernelNs)
	}
	return float64(r.e.cal.Kernel)
}

// runClock is the clock factor while x runs alone on the GPU.
func (r *gpuRun) runClock(x *instRun) float64 {
	w := x.w.Power
	if w == 0 {
		w = 1
	}
	cal := r.e.cal
	return clockFor(r.capW, func(cf float64) float64 { return tsRunPower(r.pm, cal, w, 1, cf) })
}

func (r *gpuRun) buildSlots() {
	ts := r.timeslice
	r.sch.slots = r.sch.slots[:0]
	if len(r.order) == 0 {
		return
	}
	if r.policy == nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE {
		for _, x := range r.order {
			r.sch.slots = append(r.sch.slots, tsSlot{inst: x, len: ts})
		}
		return
	}
	minShare, sum := math.Inf(1), 0.0
	for _, x := range r.order {
		if x.share > 0 && x.share < minShare {
			minShare = x.share
		}
		sum += x.share
	}
	if math.IsInf(minShare, 1) {
		minShare = 1
	}
	cycle := float64(ts) / minShare
	for _, x := range r.order {
		r.sch.slots = append(r.sch.slots, tsSlot{inst: x, len: int64(math.Round(cycle * x.share))})
	}
	if idle := int64(math.Round(cycle * (1 - sum))); idle > 0 {
		r.sch.slots = append(r.sch.slots, tsSlot{len: idle})
	}
}

// schedule decides what the GPU does from r.t on.
func (r *gpuRun) schedule() {
	s := &r.sch
	s.runner = nil
	if len(r.order) == 0 {
		s.phase, s.wake = phaseIdle, math.MaxInt64
		return
	}
	if r.strict() {
		if len(s.slots) == 0 {
			r.buildSlots()
			s.slot = -1
		}
		s.slot = (s.slot + 1) % len(s.slots)
		sl := s.slots[s.slot]
		s.slotEnd = r.t + sl.len
		x := sl.inst
		if x == nil || (x.backlog <= 0 && x.level == 0) {
			s.phase = phaseSlot
			return
		}
		s.runner = x
		s.target = sl.len
		s.cf = r.runClock(x)
		if s.last != x {
			cost := int64(r.e.cal.SwitchCost)
			if cost > sl.len {
				cost = sl.len
			}
			s.target -= cost
			s.phase, s.switchEnd = phaseSwitch, r.t+cost
			x.preemptTotal += cost
			return
		}
		r.startRun()
		return
	}
	// Best effort: the next vGPU after the cursor with a kernel queued.
	n := len(r.order)
	for i := 1; i <= n; i++ {
		x := r.order[(s.cursor+i)%n]
		if x.backlog >= r.kernel(x) {
			s.cursor = (s.cursor + i) % n
			s.runner = x
			s.target = r.timeslice
			s.cf = r.runClock(x)
			if s.last != x {
				s.phase, s.switchEnd = phaseSwitch, r.t+int64(r.e.cal.SwitchCost)
				x.preemptTotal += int64(r.e.cal.SwitchCost)
				return
			}
			r.startRun()
			return
		}
	}
	s.phase, s.wake = phaseIdle, math.MaxInt64
	for _, x := range r.order {
		if x.level <= 0 {
			continue
		}
		need := r.kernel(x) - x.backlog
		w := r.t + int64(math.Ceil(need/x.level))
		if w <= r.t {
			w = r.t + 1
		}
		if w < s.wake {
			s.wake = w
		}
	}
}

func (r *gpuRun) startRun() {
	s := &r.sch
	s.phase, s.runStart, s.runAcc = phaseRun, r.t, 0
	s.last = s.runner
	if !r.strict() {
		r.takeKernel()
	}
}

// takeKernel starts the runner's next kernel (best effort).
func (r *gpuRun) takeKernel() {
	s := &r.sch
	k := r.kernel(s.runner)
	s.runner.backlog -= k
	d := int64(math.Ceil(k / s.cf))
	if d < 1 {
		d = 1
	}
	s.kernelEnd = r.t + d
}

// event is when the scheduler acts next.
func (r *gpuRun) event() int64 {
	s := &r.sch
	switch s.phase {
	case phaseIdle:
		return s.wake
	case phaseSwitch:
		return s.switchEnd
	case phaseSlot:
		return s.slotEnd
	case phaseRun:
		if !r.strict() {
			return s.kernelEnd
		}
		x := s.runner
		if x.backlog > 0 && s.cf > x.level {
			y := r.t + int64(math.Ceil(x.backlog/(s.cf-x.level)))
			if y <= r.t {
				y = r.t + 1
			}
			if y < s.slotEnd {
				return y
			}
		}
		return s.slotEnd
	}
	return r.t
}

// fire performs the scheduler's action due at r.t.
func (r *gpuRun) fire() {
	s := &r.sch
	switch s.phase {
	case phaseIdle, phaseSlot:
		s.phase = phaseNone
	case phaseSwitch:
		r.startRun()
	case phaseRun:
		x := s.runner
		if !r.strict() {
			elapsed := r.t - s.runStart
			switch {
			case elapsed >= s.target:
				r.finishRun(true)
			case x.backlog >= r.kernel(x):
				r.takeKernel()
			default:
				r.finishRun(false)
			}
			return
		}
		if r.t >= s.slotEnd {
			r.finishRun(x.backlog > 1)
			return
		}
		// Backlog drained inside the slot: the runner keeps the slot and
		// serves arrivals as they come (trickle) until the slot ends.
		if x.backlog < 0 || x.backlog < 1e-6 {
			x.backlog = 0
		}
	}
}

// finishRun writes the run's scheduler log entry.
func (r *gpuRun) finishRun(preempted bool) {
	s := &r.sch
	x := s.runner
	run := int64(math.Round(s.runAcc))
	if !r.strict() {
		run = r.t - s.runStart
	}
	if run > 0 {
		x.runTotal += run
		r.log.add(nvml.VgpuSchedulerLogEntry{
			Timestamp: uint64(r.t), TimeRunTotal: uint64(x.runTotal), TimeRun: uint64(run), SwRunlistId: x.handle,
			TargetTimeSlice: uint64(s.target), CumulativePreemptionTime: uint64(x.preemptTotal),
		})
		x.t.runs++
		if preempted {
			x.t.preempts++
		}
	}
	s.runner = nil
	s.phase = phaseNone
}

// endRun closes a run cut short by a configuration change.
func (r *gpuRun) endRun() {
	if r.sch.runner != nil && r.sch.phase == phaseRun {
		if !r.strict() {
			// The kernel in flight is abandoned with its VM or policy.
			r.sch.runner.backlog = math.Max(0, r.sch.runner.backlog)
		}
		r.finishRun(false)
	}
	r.sch.runner = nil
	r.sch.phase = phaseNone
}

func (r *gpuRun) runTS(to int64) {
	capNs := float64(r.e.cal.BacklogCap)
	for guard := 0; r.t < to; guard++ {
		if r.sch.phase == phaseNone {
			r.schedule()
		}
		end := min(to, r.nextTrace(), r.nextBucket(), r.event())
		if end < r.t {
			end = r.t
		}
		dt := float64(end - r.t)
		s := &r.sch
		busy, watts, throttled := 0.0, r.pm.IdleW, false
		for _, x := range r.order {
			a := x.level * dt
			x.t.demand += a
			if s.phase == phaseRun && s.runner == x {
				if !r.strict() {
					x.backlog += a
					x.t.work += s.cf * dt
					x.t.run += dt
					x.bucketRun += dt
					busy = 1
				} else if x.backlog > 0 || x.level > s.cf {
					x.backlog += a - s.cf*dt
					if x.backlog < 0 {
						x.backlog = 0
					}
					x.t.work += s.cf * dt
					x.t.run += dt
					x.bucketRun += dt
					s.runAcc += dt
					busy = 1
				} else {
					// Trickle: served as it arrives.
					frac := x.level / s.cf
					x.t.work += a
					x.t.run += frac * dt
					x.bucketRun += frac * dt
					s.runAcc += frac * dt
					busy = frac
				}
				if busy > 0 {
					w := x.w.Power
					if w == 0 {
						w = 1
					}
					watts = tsRunPower(r.pm, r.e.cal, w, busy, s.cf)
					if s.cf < 1 {
						throttled = true
						x.t.throttle[reasonPowerCap] += busy * dt
					}
				}
			} else {
				x.backlog += a
			}
			if x.backlog > capNs {
				x.t.dropped += x.backlog - capNs
				x.backlog = capNs
			}
		}
		if s.phase == phaseSwitch {
			busy = 0
			watts = r.pm.IdleW
		}
		r.cf = 1
		if s.phase == phaseRun {
			r.cf = s.cf
		}
		r.account(dt, busy, watts, throttled)
		if s.phase == phaseSwitch {
			// A switch is not idle time: undo the idle reason account set.
			r.reasons &^= nvml.ClocksEventReasonGpuIdle
			r.throttle[reasonIdle] -= dt
		}
		r.t = end
		if r.traceStep() && s.phase == phaseIdle {
			// New demand: the idle GPU's wake-up time is stale.
			s.phase = phaseNone
		}
		r.flushBuckets()
		if r.t == r.event() {
			r.fire()
		} else if end == to {
			break
		}
		if guard > 1<<24 {
			// A model bug must not hang a test or the daemon.
			r.t = to
		}
	}
}

// --- MIG ---

// segment computes, for the current demands, the clock factor the power
// limit allows and each GPU instance's busy fraction and work rate.
func (r *gpuRun) segment() {
	if r.segValid {
		return
	}
	r.segValid = true
	dem, pw := map[int]float64{}, map[int]float64{}
	share := map[int]float64{}
	for _, x := range r.order {
		dem[x.gi] += x.level
		w := x.w.Power
		if w == 0 {
			w = 1
		}
		pw[x.gi] += x.level * w
		share[x.gi] = x.share
	}
	cal := r.e.cal
	dyn := (float64(r.pm.TDPW) - r.pm.IdleW) * cal.MIGPower
	power := func(cf float64) float64 {
		p := r.pm.IdleW
		for gi, d := range dem {
			e := share[gi]
			if d <= 0 || e <= 0 {
				continue
			}
			w := pw[gi] / d
			p += dyn * e * w * math.Min(cf, d/e) * math.Pow(cf, cal.PowerExponent-1)
		}
		return p
	}
	r.cf = clockFor(r.capW, power)
	r.powerW = power(r.cf)
	r.segBusy, r.segWork, r.segDem = map[int]float64{}, map[int]float64{}, dem
	for gi, d := range dem {
		e := share[gi]
		if e <= 0 {
			continue
		}
		r.segBusy[gi] = math.Min(1, d/(e*r.cf))
		r.segWork[gi] = math.Min(d, e*r.cf)
	}
}

func (r *gpuRun) runMIG(to int64) {
	for r.t < to {
		r.segment()
		end := min(to, r.nextTrace(), r.nextBucket())
		dt := float64(end - r.t)
		busy := 0.0
		throttled := r.cf < 1
		for _, x := range r.order {
			x.t.demand += x.level * dt
			b := r.segBusy[x.gi]
			if d := r.segDem[x.gi]; d > 0 {
				x.t.work += r.segWork[x.gi] * dt * x.level / d
			}
			x.t.run += b * dt
			x.bucketRun += b * dt
			if throttled {
				x.t.throttle[reasonPowerCap] += b * dt
			}
		}
		for gi, b := range r.segBusy {
			g := r.gis[gi]
			if g == nil {
				g = &giRun{}
				r.gis[gi] = g
			}
			g.busy += b * dt
			g.dram += b * memPerSM * dt
			for _, x := range r.order {
				if x.gi == gi {
					busy += b * x.share
					break
				}
			}
		}
		r.account(dt, busy, r.powerW, throttled)
		r.t = end
		r.traceStep()
		r.flushBuckets()
	}
}
