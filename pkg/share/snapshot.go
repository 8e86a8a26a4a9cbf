package share

import "time"

// Snapshot is the loop's view at the end of its latest window. Counters
// (run seconds, preemptions, clock event seconds, switches, refusals) are
// cumulative since the loop started; the rest is the latest window.
type Snapshot struct {
	// Time is when the window ended, Window how long it was.
	Time      time.Time
	Window    time.Duration
	Mode      Mode
	Inventory Inventory
	GPUs      []GPUShares
	Instances []InstanceShare
	Tenants   []TenantShare
	// Windows counts closed windows; PollErrors the failed driver reads.
	Windows    uint64
	PollErrors uint64
}

// GPUShares is one GPU in a snapshot.
type GPUShares struct {
	UUID string
	// Supported: the GPU has a device-level vGPU scheduler. When not,
	// Policy is Unsupported and SupportReason says why (the driver's
	// NOT_SUPPORTED, e.g. with MIG on).
	Supported     bool
	SupportReason string
	// Policy is the scheduler's policy now, Desired what the loop wants
	// (or, Pinned, what an operator pinned it to; the loop leaves it).
	Policy, Desired Policy
	Pinned          bool
	Timeslice       time.Duration
	// Pending is a switch the driver refused for now (VMs running).
	Pending *Pending
	// Switches counts applied switches by [from, to]; Refusals counts
	// refused attempts by target policy and reason ("not_supported", "error").
	Switches map[[2]Policy]uint64
	Refusals map[Policy]map[string]uint64
	// Fairness is Jain's index over the active instances (NaN: none).
	Fairness float64
	// ClockEventSeconds is the time each clock event reason was raised.
	ClockEventSeconds map[string]float64
	// LogEntries counts scheduler log entries read; LogOverruns the reads
	// that found entries lost (the ring wrapped between two reads).
	LogEntries, LogOverruns uint64
	// UnmatchedRunSeconds is the run time of scheduler log runlists that
	// were no running vGPU's handle, cumulative (see countUnmatched).
	UnmatchedRunSeconds float64
	// Clock is the mean SM clock over the window (1 = full).
	Clock float64
	SMMHz uint32
	// Telemetry is the latest whole-GPU reading; HasTelemetry false until one succeeded.
	HasTelemetry bool
	Telemetry    Telemetry
	// ActiveVGPUs counts the vGPUs VMs have open.
	ActiveVGPUs int
	// GPUInstances are the schedulers of its GPU instances that host
	// vGPUs (Blackwell GB20x in MIG mode; gisched.go).
	GPUInstances []GPUInstanceShares
}

// Pending is a policy switch waiting for the driver.
type Pending struct {
	To       Policy
	Since    time.Time
	Reason   string
	Attempts int
}

// InstanceShare is one instance in a snapshot.
type InstanceShare struct {
	UUID, Tenant, GPU string
	Kind              Kind
	// Active: running over the window (its VM had the vGPU open, or its
	// MIG instance was measured).
	Active bool
	// Shares of the GPU over the window (see Estimate).
	Entitled, Achieved, Demand, Interference float64
	// Saturated: it had more work than it was served.
	Saturated bool
	// Busy is the fraction of the window it ran (time-sliced) or its
	// slices were busy (MIG).
	Busy float64
	// SMUtil and MemUtil are NVML's utilization of the instance
	// (time-sliced: of the GPU; MIG: of its slices), when HasUtil.
	HasUtil         bool
	SMUtil, MemUtil float64
	// FBUsed is the framebuffer in use, when HasFB.
	HasFB  bool
	FBUsed uint64
	// RunSeconds and Preemptions count scheduler runs (time-sliced) or
	// busy slice time (MIG), cumulative.
	RunSeconds  float64
	Preemptions uint64
	// ClockEventSeconds is the time the instance ran while the GPU's
	// clocks were held back, by reason, cumulative.
	ClockEventSeconds map[string]float64
}

// Share is one instance's latest window, for the D-Bus top view.
type Share struct {
	Instance string
	Tenant   string
	GPU      string
	Active   bool
	// Fractions of the GPU over the window.
	Entitled, Achieved, Demand, Interference float64
	// Window is when the window ended.
	Window time.Time
}
