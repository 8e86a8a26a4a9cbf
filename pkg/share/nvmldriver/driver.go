// Package nvmldriver is the share loop's Driver on the NVML backend
// (pkg/gpu/nvml): it translates the backend's readings into package
// share's types. cmd/vgpud and the share loop's tests import it.
//
// Imports: pkg/gpu/nvml, pkg/share.
package nvmldriver

import (
	"context"
	"sync"

	nvmlbackend "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/share"
)

// Driver is a share.Driver over an NVML backend.
type Driver struct {
	b *nvmlbackend.Backend

	mu     sync.Mutex
	probes map[string]*gpu
}

// New returns the driver over b.
func New(b *nvmlbackend.Backend) *Driver { return &Driver{b: b, probes: map[string]*gpu{}} }

// GPU returns the driver of the GPU with uuid (one per GPU, kept).
func (d *Driver) GPU(uuid string) share.GPUDriver {
	d.mu.Lock()
	defer d.mu.Unlock()
	g := d.probes[uuid]
	if g == nil {
		g = &gpu{p: d.b.Probe(uuid), b: d.b, uuid: uuid}
		d.probes[uuid] = g
	}
	return g
}

type gpu struct {
	p    *nvmlbackend.Probe
	b    *nvmlbackend.Backend
	uuid string
}

var (
	_ share.GPUDriver                  = (*gpu)(nil)
	_ share.GPUInstanceSchedulerDriver = (*gpu)(nil)
)

func policyOf(p uint32) share.Policy {
	switch p {
	case nvmlbackend.PolicyBestEffort:
		return share.BestEffort
	case nvmlbackend.PolicyEqualShare:
		return share.EqualShare
	case nvmlbackend.PolicyFixedShare:
		return share.FixedShare
	}
	return share.Unknown
}

func nvmlPolicy(p share.Policy) uint32 {
	switch p {
	case share.BestEffort:
		return nvmlbackend.PolicyBestEffort
	case share.EqualShare:
		return nvmlbackend.PolicyEqualShare
	case share.FixedShare:
		return nvmlbackend.PolicyFixedShare
	}
	return nvmlbackend.PolicyUnknown
}

func (g *gpu) SchedulerCapabilities(ctx context.Context) (share.Caps, error) {
	c, err := g.p.SchedulerCapabilities(ctx)
	if err != nil {
		return share.Caps{}, err
	}
	out := share.Caps{MinTimeslice: c.MinTimeslice, MaxTimeslice: c.MaxTimeslice, ARR: c.ARR,
		MinFrequency: c.MinFrequency, MaxFrequency: c.MaxFrequency, MinAvgFactor: c.MinAvgFactor, MaxAvgFactor: c.MaxAvgFactor}
	for _, p := range c.Policies {
		if x := policyOf(p); x != share.Unknown {
			out.Policies = append(out.Policies, x)
		}
	}
	return out, nil
}

func (g *gpu) SchedulerState(ctx context.Context) (share.State, error) {
	s, err := g.p.SchedulerState(ctx)
	if err != nil {
		return share.State{}, err
	}
	return share.State{Policy: policyOf(s.Policy), ARR: s.ARR, Timeslice: s.Timeslice, Frequency: s.Frequency, AvgFactor: s.AvgFactor}, nil
}

func (g *gpu) SetSchedulerState(ctx context.Context, s share.State) error {
	return g.p.SetSchedulerState(ctx, nvmlbackend.SchedulerState{Policy: nvmlPolicy(s.Policy), ARR: s.ARR, Timeslice: s.Timeslice,
		Frequency: s.Frequency, AvgFactor: s.AvgFactor})
}

func (g *gpu) SchedulerLog(ctx context.Context) (share.Log, error) {
	l, err := g.p.SchedulerLog(ctx)
	if err != nil {
		return share.Log{}, err
	}
	out := share.Log{Policy: policyOf(l.Policy), Full: l.Full, Entries: make([]share.LogEntry, len(l.Entries))}
	for i, e := range l.Entries {
		out.Entries[i] = share.LogEntry{Time: e.Time, Runlist: e.Runlist, Run: e.Run, RunTotal: e.RunTotal, Target: e.Target, Preempted: e.Preempted()}
	}
	return out, nil
}

func (g *gpu) ActiveVGPUs(ctx context.Context) ([]share.VGPU, error) {
	vs, err := g.p.ActiveVGPUs(ctx)
	out := make([]share.VGPU, len(vs))
	for i, v := range vs {
		out[i] = share.VGPU{Handle: v.Handle, UUID: v.UUID, MdevUUID: v.MdevUUID, VMID: v.VMID, TypeID: v.TypeID, GI: v.GI, FBUsed: v.FBUsed}
	}
	return out, err
}

func (g *gpu) ActiveVGPUCount(ctx context.Context) (int, error) { return g.p.ActiveVGPUCount(ctx) }

func (g *gpu) VGPUUtilization(ctx context.Context, since uint64) ([]share.UtilSample, uint64, error) {
	ss, last, err := g.p.VGPUUtilization(ctx, since)
	out := make([]share.UtilSample, len(ss))
	for i, s := range ss {
		out[i] = share.UtilSample{Handle: s.Handle, Time: s.Time, SM: s.SM, Mem: s.Mem}
	}
	return out, last, err
}

func (g *gpu) Clocks(ctx context.Context) (share.Clocks, error) {
	c, err := g.p.Clocks(ctx)
	return share.Clocks{SMMHz: c.SMMHz, Reasons: c.Reasons}, err
}

func (g *gpu) Telemetry(ctx context.Context, full bool) (share.Telemetry, error) {
	t, err := g.p.Telemetry(ctx, full)
	return share.Telemetry{HasUtil: t.HasUtil, Util: t.Util, MemUtil: t.MemUtil, PowerW: t.PowerW, PowerLimitW: t.PowerLimitW,
		HasEnergy: t.HasEnergy, EnergyJ: t.EnergyJ, TemperatureC: t.TemperatureC, SMMaxMHz: t.SMMaxMHz, MemTotal: t.MemTotal, MemUse: t.MemUse}, err
}

func (g *gpu) MIGActivity(ctx context.Context, gis []int) (map[int]share.MIGActivity, error) {
	a, err := g.p.MIGActivity(ctx, gis)
	out := make(map[int]share.MIGActivity, len(a))
	for k, v := range a {
		out[k] = share.MIGActivity{SM: v.SM, DRAM: v.DRAM}
	}
	return out, err
}

func (g *gpu) MIGMemory(ctx context.Context) (map[int][2]uint64, error) { return g.p.MIGMemory(ctx) }

// GPUInstanceSchedulerState reads GPU instance gi's scheduler (Blackwell
// GB20x; gpu.ErrNotSupported elsewhere).
func (g *gpu) GPUInstanceSchedulerState(ctx context.Context, gi int) (share.State, error) {
	s, err := g.b.GPUInstanceSchedulerState(ctx, g.uuid, gi)
	if err != nil {
		return share.State{}, err
	}
	return share.State{Policy: policyOf(s.Policy), ARR: s.ARR, Timeslice: s.Timeslice, AvgFactor: s.AvgFactor}, nil
}

// SetGPUInstanceSchedulerState sets GPU instance gi's scheduler
// (gpu.ErrNotSupported while a VM runs in it).
func (g *gpu) SetGPUInstanceSchedulerState(ctx context.Context, gi int, s share.State) error {
	return g.b.SetGPUInstanceSchedulerState(ctx, g.uuid, gi, nvmlbackend.SchedulerState{Policy: nvmlPolicy(s.Policy), ARR: s.ARR, Timeslice: s.Timeslice,
		Frequency: s.Frequency, AvgFactor: s.AvgFactor})
}
