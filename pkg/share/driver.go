package share

import (
	"context"
	"time"
)

// Driver gives the loop one GPUDriver per GPU (package nvmldriver
// implements it on the NVML backend).
type Driver interface {
	GPU(uuid string) GPUDriver
}

// GPUDriver reads and drives one GPU. Errors wrap pkg/gpu's sentinels:
// gpu.ErrNotSupported for what the GPU or its mode lacks (the scheduler
// with MIG on, a policy change while VMs run), gpu.ErrGPULost, ...
type GPUDriver interface {
	SchedulerCapabilities(ctx context.Context) (Caps, error)
	SchedulerState(ctx context.Context) (State, error)
	// SetSchedulerState is refused with gpu.ErrNotSupported while a VM
	// with a vGPU runs on the GPU.
	SetSchedulerState(ctx context.Context, s State) error
	SchedulerLog(ctx context.Context) (Log, error)
	// ActiveVGPUs lists the vGPUs VMs have open; ActiveVGPUCount only counts them.
	ActiveVGPUs(ctx context.Context) ([]VGPU, error)
	ActiveVGPUCount(ctx context.Context) (int, error)
	// VGPUUtilization returns samples newer than since (µs) and the newest timestamp.
	VGPUUtilization(ctx context.Context, since uint64) ([]UtilSample, uint64, error)
	Clocks(ctx context.Context) (Clocks, error)
	// Telemetry reads power, energy, temperature and utilization; with full
	// also what moves slowly (power limit, maximum clock, memory).
	Telemetry(ctx context.Context, full bool) (Telemetry, error)
	// MIGActivity samples the GPU instances and returns their activity
	// since the previous call (instances seen the first time are absent).
	MIGActivity(ctx context.Context, gis []int) (map[int]MIGActivity, error)
	// MIGMemory returns total and used bytes per GPU instance.
	MIGMemory(ctx context.Context) (map[int][2]uint64, error)
}

// Caps is what a GPU's vGPU scheduler supports.
type Caps struct {
	Policies                   []Policy
	MinTimeslice, MaxTimeslice time.Duration
	ARR                        bool
	MinFrequency, MaxFrequency uint32
	MinAvgFactor, MaxAvgFactor uint32
}

func (c Caps) supports(p Policy) bool {
	for _, x := range c.Policies {
		if x == p {
			return true
		}
	}
	return false
}

// State is a scheduler policy with its parameters.
type State struct {
	Policy Policy
	// ARR enables adaptive round robin (Frequency, AvgFactor); otherwise
	// Timeslice applies (0: the driver's default).
	ARR       bool
	Timeslice time.Duration
	Frequency uint32
	AvgFactor uint32
}

// LogEntry is one run in the scheduler log.
type LogEntry struct {
	// Time is when the run ended, in the driver's clock (ns).
	Time int64
	// Runlist is the vGPU's runlist id, which is its VGPU.Handle.
	Runlist       uint32
	Run, RunTotal time.Duration
	Target        time.Duration
	// Preempted: the run ended because its slice was over (more work was
	// queued), not because the vGPU yielded.
	Preempted bool
}

// Log is the scheduler's ring of recent runs, oldest first; Full when the
// ring was full (so older entries may have been lost).
type Log struct {
	Policy  Policy
	Entries []LogEntry
	Full    bool
}

// VGPU is a running vGPU.
type VGPU struct {
	Handle   uint32
	UUID     string
	MdevUUID string
	VMID     string
	TypeID   int
	GI       int
	FBUsed   uint64
}

// UtilSample is one utilization sample of a vGPU (fractions of the GPU).
type UtilSample struct {
	Handle  uint32
	Time    uint64
	SM, Mem float64
}

// Clocks is a GPU's SM clock and clock event reasons (NVML bits) now.
type Clocks struct {
	SMMHz   uint32
	Reasons uint64
}

// Telemetry is a GPU's whole-device readings.
type Telemetry struct {
	HasUtil          bool
	Util, MemUtil    float64
	PowerW           float64
	PowerLimitW      float64
	HasEnergy        bool
	EnergyJ          float64
	TemperatureC     float64
	SMMaxMHz         uint32
	MemTotal, MemUse uint64
}

// MIGActivity is a GPU instance's activity between two samples.
type MIGActivity struct {
	SM, DRAM float64
}

// Clock event reasons: NVML's bits and the names metrics use.
var reasonNames = []struct {
	bit  uint64
	name string
}{
	{1, "gpu_idle"},
	{2, "applications_clocks_setting"},
	{4, "sw_power_cap"},
	{8, "hw_slowdown"},
	{16, "sync_boost"},
	{32, "sw_thermal_slowdown"},
	{64, "hw_thermal_slowdown"},
	{128, "hw_power_brake_slowdown"},
	{256, "display_clock_setting"},
	{512, "board_limit"},
	{1024, "reliability"},
}

// ReasonNames lists the clock event reason names metrics use, in bit order.
func ReasonNames() []string {
	out := make([]string, len(reasonNames))
	for i, r := range reasonNames {
		out[i] = r.name
	}
	return out
}

// slowdownReasons are the reasons that hold clocks below what the load
// asks for; their time is attributed to the instances that ran through it.
func slowdownReasons() []string {
	return []string{"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
}
