package share

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// gpuPoller measures and drives one GPU. Its methods run on the loop's
// goroutine for that GPU, one at a time.
type gpuPoller struct {
	l    *Loop
	uuid string
	drv  GPUDriver
	info GPU

	// scheduler
	capsRead  bool
	caps      Caps
	supported bool
	reason    string
	state     State
	stateRead bool
	desired   Policy
	pending   *Pending
	lastTry   time.Time
	switches  map[[2]Policy]uint64
	refusals  map[Policy]map[string]uint64
	starved   time.Duration // adaptive: how long a guaranteed instance has been starved
	calm      time.Duration // adaptive: how long the GPU has seen no contention
	explained bool          // the unsupported scheduler was logged
	// unsupportedLogged: a wanted policy the GPU does not offer was logged.
	unsupportedLogged map[Policy]bool
	// gis are the schedulers of the GPU's GPU instances (gisched.go).
	gis map[int]*giPoller

	// scheduler log
	logSeen    bool
	lastEntry  int64
	lastTotal  map[uint32]time.Duration
	logEntries uint64
	overruns   uint64
	runs       map[uint32]*runAcc
	// unmatchedRun is run time of runlists that are no running vGPU's
	// handle, or whose vGPU matches no instance; unmatchedLogged: the
	// likely cause was logged; unmatchedVGPUs: running vGPUs no instance
	// matched that were logged (by handle, forgotten when they stop).
	unmatchedRun    time.Duration
	unmatchedLogged bool
	unmatchedVGPUs  map[uint32]bool

	// clocks
	lastPoll  time.Time
	reasonSec map[string]float64
	winReason map[string]float64
	clockSum  float64
	clockN    int
	smMHz     uint32
	maxMHz    uint32

	// telemetry
	tel       Telemetry
	hasTel    bool
	windows   int
	utilSince uint64
	active    int
	// instances is how many instances the GPU held at the last window.
	instances int
	migMem    map[int][2]uint64

	inst map[string]*instAcc

	errs       uint64
	lastErrLog time.Time

	// awake: a VM event came since the last window, so the GPU may run
	// vGPUs now that it did not run then (see idle).
	awake bool
}

// idle: the GPU runs nothing (no active vGPU at the last window, no MIG
// instance, no VM event since) and has no policy switch pending, so it
// has no scheduler log to read and no share to attribute clocks to.
func (p *gpuPoller) idle() bool {
	return p.windows > 0 && p.active == 0 && !(p.info.MIG && p.instances > 0) && p.pending == nil && !p.awake
}

// needsPolls: the GPU is read at every poll, not only at the window: a
// time-sliced GPU that runs vGPUs (its scheduler log is a ring of 200
// entries), or one with a policy switch waiting for its VMs to stop.
func (p *gpuPoller) needsPolls() bool {
	return polled(p.info) && (p.pending != nil || (p.timeSliced() && !p.idle()))
}

type runAcc struct {
	run, sat time.Duration
	preempts uint64
}

type instAcc struct {
	runSec   float64
	preempts uint64
	clockSec map[string]float64
}

func newPoller(l *Loop, g GPU) *gpuPoller {
	p := &gpuPoller{l: l, uuid: g.UUID, drv: l.drv.GPU(g.UUID), info: g, switches: map[[2]Policy]uint64{},
		refusals: map[Policy]map[string]uint64{}, unsupportedLogged: map[Policy]bool{}, lastTotal: map[uint32]time.Duration{}, runs: map[uint32]*runAcc{},
		reasonSec: map[string]float64{}, winReason: map[string]float64{}, inst: map[string]*instAcc{}, desired: Unknown}
	for _, r := range reasonNames {
		p.reasonSec[r.name] = 0
	}
	return p
}

// fail counts a driver error and logs it, at most once a minute per GPU.
func (p *gpuPoller) fail(now time.Time, what string, err error) {
	p.errs++
	if now.Sub(p.lastErrLog) >= time.Minute || p.lastErrLog.IsZero() {
		p.lastErrLog = now
		p.l.log.Warn("share loop: driver read failed", "gpu", p.uuid, "what", what, "err", err, "errors", p.errs)
	}
}

// timeSliced: the GPU shares time between vGPUs (no MIG).
func (p *gpuPoller) timeSliced() bool { return !p.info.MIG }

// readScheduler reads the capabilities once and the state now.
func (p *gpuPoller) readScheduler(ctx context.Context, now time.Time) {
	if !p.capsRead {
		c, err := p.drv.SchedulerCapabilities(ctx)
		switch {
		case err == nil:
			p.capsRead, p.caps, p.supported = true, c, true
		case errors.Is(err, gpu.ErrNotSupported):
			p.capsRead, p.supported = true, false
			p.reason = "the driver reports the device-level vGPU scheduler NOT_SUPPORTED"
			if p.info.MIG {
				p.reason += " with MIG on (MIG compute is hardware-isolated)"
			}
			if !p.explained {
				p.explained = true
				p.l.log.Info("vGPU scheduler not supported: policies are not set on this GPU", "gpu", p.uuid, "why", p.reason, "err", err)
			}
		default:
			p.fail(now, "scheduler capabilities", err)
			return
		}
	}
	if !p.supported {
		return
	}
	s, err := p.drv.SchedulerState(ctx)
	if err != nil {
		if errors.Is(err, gpu.ErrNotSupported) {
			// MIG was enabled meanwhile: read the capabilities again.
			p.capsRead = false
			return
		}
		p.fail(now, "scheduler state", err)
		return
	}
	p.state, p.stateRead = s, true
}

// poll is one poll: clocks, the scheduler log, a pending switch.
func (p *gpuPoller) poll(ctx context.Context, now time.Time) {
	dt := 0.0
	if !p.lastPoll.IsZero() {
		dt = now.Sub(p.lastPoll).Seconds()
	}
	p.lastPoll = now
	if !p.capsRead {
		p.readScheduler(ctx, now)
	}
	if !p.hasTel {
		// The maximum clock is needed to read the first clock samples.
		if t, err := p.drv.Telemetry(ctx, true); err == nil {
			p.tel, p.hasTel, p.maxMHz = t, true, t.SMMaxMHz
		}
	}
	if c, err := p.drv.Clocks(ctx); err != nil {
		p.fail(now, "clocks", err)
	} else {
		for _, r := range reasonNames {
			if c.Reasons&r.bit != 0 {
				p.reasonSec[r.name] += dt
				p.winReason[r.name] += dt
			}
		}
		p.smMHz = c.SMMHz
		// An idle GPU's clock says nothing about what a busy one gets.
		if c.Reasons&1 == 0 && p.maxMHz > 0 {
			p.clockSum += min(1, float64(c.SMMHz)/float64(p.maxMHz))
			p.clockN++
		}
	}
	if p.timeSliced() && p.supported {
		if l, err := p.drv.SchedulerLog(ctx); err != nil {
			if !errors.Is(err, gpu.ErrNotSupported) {
				p.fail(now, "scheduler log", err)
			}
		} else {
			p.readLog(l)
		}
	}
	if p.pending != nil {
		p.retry(ctx, now)
	}
}

// readLog takes the entries newer than the last read. Run time comes from
// the runlists' cumulative totals, so entries the ring lost between two
// reads still count; the read is counted as an overrun.
func (p *gpuPoller) readLog(l Log) {
	if !p.logSeen {
		// The first read sets the baseline: the ring's history predates
		// the loop. An empty ring is a baseline too: what comes next is new.
		p.logSeen = true
		for _, e := range l.Entries {
			p.lastTotal[e.Runlist] = e.RunTotal
			p.lastEntry = max(p.lastEntry, e.Time)
		}
		return
	}
	if len(l.Entries) == 0 {
		return
	}
	if l.Full && l.Entries[0].Time > p.lastEntry {
		p.overruns++
	}
	for _, e := range l.Entries {
		if e.Time <= p.lastEntry {
			continue
		}
		p.lastEntry = e.Time
		p.logEntries++
		run := e.Run
		if prev, ok := p.lastTotal[e.Runlist]; ok && e.RunTotal >= prev+e.Run {
			run = e.RunTotal - prev
		}
		p.lastTotal[e.Runlist] = e.RunTotal
		a := p.runs[e.Runlist]
		if a == nil {
			a = &runAcc{}
			p.runs[e.Runlist] = a
		}
		a.run += run
		if e.Preempted {
			a.sat += e.Run
			a.preempts++
		}
	}
}

// matchVGPUs pairs instances with running vGPUs: by mdev UUID, then by
// the VM's UUID (and type), then, per type, a single unmatched instance
// with a single unmatched vGPU.
func matchVGPUs(insts []Instance, active []VGPU) map[string]VGPU {
	out := map[string]VGPU{}
	used := map[uint32]bool{}
	for _, i := range insts {
		if i.MdevUUID == "" {
			continue
		}
		for _, v := range active {
			if !used[v.Handle] && strings.EqualFold(v.MdevUUID, i.MdevUUID) {
				out[i.UUID], used[v.Handle] = v, true
				break
			}
		}
	}
	for _, i := range insts {
		if _, ok := out[i.UUID]; ok || i.VMUUID == "" {
			continue
		}
		for _, v := range active {
			if !used[v.Handle] && strings.EqualFold(v.VMID, i.VMUUID) && (i.TypeID == 0 || v.TypeID == i.TypeID) {
				out[i.UUID], used[v.Handle] = v, true
				break
			}
		}
	}
	byType := map[int][]Instance{}
	for _, i := range insts {
		if _, ok := out[i.UUID]; !ok {
			byType[i.TypeID] = append(byType[i.TypeID], i)
		}
	}
	freeByType := map[int][]VGPU{}
	for _, v := range active {
		if !used[v.Handle] {
			freeByType[v.TypeID] = append(freeByType[v.TypeID], v)
		}
	}
	for t, is := range byType {
		if vs := freeByType[t]; len(is) == 1 && len(vs) == 1 {
			out[is[0].UUID] = vs[0]
		}
	}
	return out
}

// closeWindow computes the window's shares for the GPU's instances.
func (p *gpuPoller) closeWindow(ctx context.Context, now time.Time, window time.Duration, insts []Instance) []InstanceShare {
	secs := window.Seconds()
	p.windows++
	p.instances = len(insts)
	p.awake = false
	slow := p.windows == 1 || p.windows%p.l.cfg.SlowEvery == 0
	if p.windows == 1 || p.windows%p.l.cfg.TelemetryEvery == 0 {
		if t, err := p.drv.Telemetry(ctx, slow); err != nil {
			p.fail(now, "telemetry", err)
		} else {
			p.tel, p.hasTel = t, true
			if t.SMMaxMHz > 0 {
				p.maxMHz = t.SMMaxMHz
			}
		}
	}
	if !p.capsRead || p.supported {
		p.readScheduler(ctx, now)
	}
	clock := 1.0
	if p.clockN > 0 {
		clock = p.clockSum / float64(p.clockN)
	}
	out := make([]InstanceShare, 0, len(insts))
	measured := map[string]Measured{}
	util := map[string][3]float64{} // sm, mem, n
	fb := map[string]uint64{}
	if p.timeSliced() {
		active, err := p.drv.ActiveVGPUs(ctx)
		if err != nil {
			p.fail(now, "active vGPUs", err)
		}
		p.active = len(active)
		match := matchVGPUs(insts, active)
		samples, last, err := p.drv.VGPUUtilization(ctx, p.utilSince)
		if err != nil && !errors.Is(err, gpu.ErrNotSupported) {
			p.fail(now, "vGPU utilization", err)
		}
		p.utilSince = last
		byHandle := map[uint32][3]float64{}
		for _, s := range samples {
			u := byHandle[s.Handle]
			byHandle[s.Handle] = [3]float64{u[0] + s.SM, u[1] + s.Mem, u[2] + 1}
		}
		p.countUnmatched(active, match)
		for uuid, v := range match {
			a := p.runs[v.Handle]
			m := Measured{Clock: clock}
			if a != nil && secs > 0 {
				m.Busy = min(1, a.run.Seconds()/secs)
				m.Saturated = a.run > 0 && a.sat.Seconds() >= saturatedRuns*a.run.Seconds()
				acc := p.acc(uuid)
				acc.runSec += a.run.Seconds()
				acc.preempts += a.preempts
			}
			measured[uuid] = m
			if u := byHandle[v.Handle]; u[2] > 0 {
				util[uuid] = u
			}
			fb[uuid] = v.FBUsed
		}
	} else {
		var gis []int
		for _, i := range insts {
			if i.GI >= 0 {
				gis = append(gis, i.GI)
			}
		}
		act, err := p.drv.MIGActivity(ctx, gis)
		if err != nil {
			p.fail(now, "MIG activity", err)
		}
		// Framebuffer use moves slowly: it is read every few windows.
		if slow || p.migMem == nil {
			mem, err := p.drv.MIGMemory(ctx)
			if err != nil {
				p.fail(now, "MIG memory", err)
			} else {
				p.migMem = mem
			}
		}
		mem := p.migMem
		for _, i := range insts {
			if a, ok := act[i.GI]; ok && i.GI >= 0 {
				m := Measured{Busy: min(1, a.SM), Saturated: a.SM >= saturatedMIG, Clock: clock}
				measured[i.UUID] = m
				util[i.UUID] = [3]float64{a.SM, a.DRAM, 1}
				p.acc(i.UUID).runSec += a.SM * secs
			}
			if x, ok := mem[i.GI]; ok && i.GI >= 0 {
				fb[i.UUID] = x[1]
			}
		}
	}
	for _, i := range insts {
		s := InstanceShare{UUID: i.UUID, Tenant: i.Tenant, GPU: i.GPU, Kind: i.Kind, Entitled: i.Entitled()}
		acc := p.acc(i.UUID)
		if m, ok := measured[i.UUID]; ok {
			s.Active = true
			s.Busy, s.Saturated = m.Busy, m.Saturated
			s.Achieved, s.Demand, s.Interference = Estimate(i, m)
			for r, sec := range p.winReason {
				if _, slows := acc.clockSec[r]; slows {
					acc.clockSec[r] += sec * m.Busy
				}
			}
		}
		if u, ok := util[i.UUID]; ok {
			s.HasUtil, s.SMUtil, s.MemUtil = true, u[0]/u[2], u[1]/u[2]
		}
		if b, ok := fb[i.UUID]; ok {
			s.HasFB, s.FBUsed = true, b
		}
		s.RunSeconds, s.Preemptions = acc.runSec, acc.preempts
		s.ClockEventSeconds = make(map[string]float64, len(acc.clockSec))
		for k, v := range acc.clockSec {
			s.ClockEventSeconds[k] = v
		}
		out = append(out, s)
	}
	// Forget instances that left the GPU.
	keep := map[string]bool{}
	for _, i := range insts {
		keep[i.UUID] = true
	}
	for k := range p.inst {
		if !keep[k] {
			delete(p.inst, k)
		}
	}
	p.runs = map[uint32]*runAcc{}
	p.winReason = map[string]float64{}
	p.clockSum, p.clockN = 0, 0
	return out
}

// countUnmatched adds up the window's run time of runlists that no
// instance is matched to: runlists that are no running vGPU's handle, and
// running vGPUs that match no instance (two vGPUs of one type opened by a
// VM whose UUID vgpud does not know, a vGPU vgpud did not create). The
// log's runlist id is taken to be the vGPU's NVML handle (the simulator's
// convention; nvml.h calls it a "software runlist id"): if a driver
// numbers them otherwise, every run is unmatched and the instances read
// idle, which this makes visible. A VM that stopped during the window
// leaves its last runs unmatched too. Each unmatched running vGPU is
// logged once, with what identifies it.
func (p *gpuPoller) countUnmatched(active []VGPU, match map[string]VGPU) {
	running := map[uint32]bool{}
	for _, v := range active {
		running[v.Handle] = true
	}
	owned := map[uint32]bool{}
	for _, v := range match {
		owned[v.Handle] = true
	}
	var matched, unmatched, foreign time.Duration
	for id, a := range p.runs {
		switch {
		case owned[id]:
			matched += a.run
		case running[id]:
			foreign += a.run
		default:
			unmatched += a.run
		}
	}
	p.unmatchedRun += unmatched + foreign
	if unmatched > 0 && matched == 0 && foreign == 0 && len(active) > 0 && !p.unmatchedLogged {
		p.unmatchedLogged = true
		p.l.log.Warn("vGPU scheduler log: no runlist matches a running vGPU's handle; run time is not attributed to instances (see vgpud_gpu_scheduler_unmatched_run_seconds_total)",
			"gpu", p.uuid, "unmatched", unmatched, "active_vgpus", len(active))
	}
	if p.unmatchedVGPUs == nil {
		p.unmatchedVGPUs = map[uint32]bool{}
	}
	for h := range p.unmatchedVGPUs {
		if !running[h] || owned[h] {
			delete(p.unmatchedVGPUs, h)
		}
	}
	for _, v := range active {
		if owned[v.Handle] || p.unmatchedVGPUs[v.Handle] {
			continue
		}
		p.unmatchedVGPUs[v.Handle] = true
		run := time.Duration(0)
		if a := p.runs[v.Handle]; a != nil {
			run = a.run
		}
		p.l.log.Warn("running vGPU matches no instance: its run time is not attributed (counted in vgpud_gpu_scheduler_unmatched_run_seconds_total); attach instances through vgpud so their VM's UUID is known",
			"gpu", p.uuid, "handle", v.Handle, "vm_uuid", v.VMID, "mdev", v.MdevUUID, "type_id", v.TypeID, "run", run)
	}
}

func (p *gpuPoller) acc(uuid string) *instAcc {
	a := p.inst[uuid]
	if a == nil {
		a = &instAcc{clockSec: map[string]float64{}}
		for _, r := range slowdownReasons() {
			a.clockSec[r] = 0
		}
		p.inst[uuid] = a
	}
	return a
}

// view is the GPU's part of a snapshot.
func (p *gpuPoller) view(shares []InstanceShare) GPUShares {
	g := GPUShares{UUID: p.uuid, Supported: p.supported, SupportReason: p.reason, Policy: Unknown, Desired: p.desired,
		Switches: map[[2]Policy]uint64{}, Refusals: map[Policy]map[string]uint64{}, ClockEventSeconds: map[string]float64{},
		LogEntries: p.logEntries, LogOverruns: p.overruns, UnmatchedRunSeconds: p.unmatchedRun.Seconds(), SMMHz: p.smMHz, HasTelemetry: p.hasTel, Telemetry: p.tel, ActiveVGPUs: p.active,
		GPUInstances: p.giViews()}
	if p.capsRead && !p.supported {
		g.Policy, g.Desired = Unsupported, Unsupported
	} else if p.stateRead {
		g.Policy, g.Timeslice = p.state.Policy, p.state.Timeslice
	}
	if p.pending != nil {
		x := *p.pending
		g.Pending = &x
	}
	if p.info.Pinned {
		// The manager sets a pinned policy; the snapshot shows it as the
		// wanted one, pending while the driver refuses it.
		g.Pinned, g.Desired, g.Pending = true, p.info.PinnedPolicy, nil
		if p.info.PinnedPending {
			g.Pending = &Pending{To: p.info.PinnedPolicy, Reason: "pinned by an operator; set when the GPU's VMs with vGPUs stop"}
		}
	}
	for k, v := range p.switches {
		g.Switches[k] = v
	}
	for to, m := range p.refusals {
		g.Refusals[to] = map[string]uint64{}
		for r, n := range m {
			g.Refusals[to][r] = n
		}
	}
	for k, v := range p.reasonSec {
		g.ClockEventSeconds[k] = v
	}
	g.Clock = 1
	if p.maxMHz > 0 && p.smMHz > 0 {
		g.Clock = float64(p.smMHz) / float64(p.maxMHz)
	}
	var xs []float64
	for _, s := range shares {
		if !s.Active {
			continue
		}
		i := p.l.instance(s.UUID)
		if x, ok := fairnessInput(i, s.Achieved, s.Demand); ok {
			xs = append(xs, x)
		}
	}
	sort.Float64s(xs)
	g.Fairness = Jain(xs)
	return g
}

func (p *gpuPoller) String() string { return fmt.Sprintf("GPU %s", p.uuid) }
