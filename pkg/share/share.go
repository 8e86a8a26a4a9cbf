// Package share measures and enforces tenants' compute shares. Per window
// it computes, for every instance, its entitled share, a demand estimate,
// the share it achieved and its interference index
// max(0, 1 - achieved/min(demand, entitled)); per tenant the sums and the
// worst instance; per GPU Jain's fairness index. It sets each time-sliced
// GPU's vGPU scheduler policy from the tenants' scheduling classes, or
// adaptively: work-conserving best effort while no guaranteed instance is
// starved, fixed share when one is, back with hysteresis.
//
// Its inputs are an inventory Source (the manager's records) and a Driver
// (NVML, through package nvmldriver); it keeps the latest window in a
// Snapshot that the metrics and the D-Bus API read without touching the
// driver. See docs/metrics.md for the definitions and their limits.
//
// It imports pkg/gpu only; cmd/vgpud wires it.
//
// Imports: pkg/gpu.
package share

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// ErrBadConfig is wrapped by New's validation errors.
var ErrBadConfig = errors.New("invalid share loop configuration")

// Kind is how an instance shares its GPU.
type Kind string

const (
	// TimeSliced instances share a GPU by the vGPU scheduler's time slices.
	TimeSliced Kind = "time-sliced"
	// MIG instances own their slices (MIG instances and MIG-backed vGPUs).
	MIG Kind = "mig"
	// Passthrough instances own a whole GPU; the loop does not measure them.
	Passthrough Kind = "passthrough"
)

// Policy is a vGPU scheduler policy, as metric labels name it.
type Policy string

const (
	BestEffort Policy = "best_effort"
	EqualShare Policy = "equal_share"
	FixedShare Policy = "fixed_share"
	// Unsupported: the GPU has no device-level vGPU scheduler (MIG on, no
	// vGPU manager): the driver answers NOT_SUPPORTED.
	Unsupported Policy = "unsupported"
	// Unknown: not read yet, or the driver reported a policy this build
	// does not know.
	Unknown Policy = "unknown"
)

// Mode is how the loop chooses policies.
type Mode string

const (
	// Observe measures and never changes a policy.
	Observe Mode = "observe"
	// Static sets FIXED_SHARE on GPUs hosting a guaranteed tenant's
	// time-sliced instance and the shared policy elsewhere.
	Static Mode = "static"
	// Adaptive stays on the shared (work-conserving) policy until a
	// guaranteed instance is starved, then switches that GPU to
	// FIXED_SHARE, and back once contention is gone.
	Adaptive Mode = "adaptive"
)

// ParseMode returns the mode named s.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case Observe, Static, Adaptive:
		return m, nil
	}
	return "", fmt.Errorf("%w: mode %q: want observe, static or adaptive", ErrBadConfig, s)
}

// Instance is one instance as the loop needs it.
type Instance struct {
	UUID   string
	Tenant string
	// Guaranteed: the tenant's class is guaranteed, so the instance is
	// entitled to its compute share.
	Guaranteed bool
	// GPU is the GPU's UUID.
	GPU  string
	Kind Kind
	// RecordKind is the record's kind as vgpuctl and the D-Bus API name
	// it (mig, mig-vgpu, vgpu, passthrough); Kind is how the loop
	// measures it.
	RecordKind string
	Profile    string
	// VM and VMUUID name the VM it is attached to ("" when none).
	VM, VMUUID string
	// MdevUUID or VF identify a vGPU on the host.
	MdevUUID, VF string
	// GI is the MIG GPU instance id (-1 for time-sliced vGPUs); GIStart
	// and GISize its placement.
	GI, GIStart, GISize int
	// TypeID is the vGPU type id (0 for plain MIG instances).
	TypeID int
	// ComputeMilli is the instance's compute share in milli-GPU as admission
	// recorded it (MIG: slices over the grid; time-sliced: 1000/max instances).
	ComputeMilli uint64
	VRAMBytes    uint64
	// State is the record's state (ready, creating, failed, lost, destroying).
	State string
}

// Nominal is the instance's compute share as a fraction of its GPU.
func (i Instance) Nominal() float64 { return float64(i.ComputeMilli) / 1000 }

// Entitled is the share the instance is owed: its nominal share for a
// guaranteed tenant, nothing for a best-effort one.
func (i Instance) Entitled() float64 {
	if !i.Guaranteed {
		return 0
	}
	return i.Nominal()
}

// GPU is one GPU as the loop needs it.
type GPU struct {
	// Index is the GPU's NVML index (dcgm-exporter's gpu label).
	Index                     int
	UUID, PCI, Model, Product string
	// MIG is true with MIG mode on.
	MIG bool
	// Flavour is the vGPU flow (mdev, vfio, none).
	Flavour string
	// State is ok, lost, failed or passthrough.
	State gpu.State
	// MIGSlots is the MIG grid's number of memory slices (0 without MIG).
	MIGSlots int
	// Pinned: an operator pinned the GPU's scheduler policy (vgpuctl gpu
	// scheduler) to PinnedPolicy; the loop never changes it. PinnedPending:
	// the driver has not taken it yet (VMs with vGPUs run).
	Pinned        bool
	PinnedPolicy  Policy
	PinnedPending bool
	// GPUInstanceSchedulers are the schedulers of the GPU's GPU instances
	// that host vGPUs (Blackwell GB20x), as vgpud manages them; the loop
	// drives those no operator pinned (gisched.go).
	GPUInstanceSchedulers []GPUInstanceScheduler
}

// GPUInstanceScheduler is one GPU instance's scheduler: pinned to Policy
// and Timeslice (0: the driver's) by an operator, or not (Pinned false);
// Pending: the driver has not taken the pin yet.
type GPUInstanceScheduler struct {
	GI        int
	Profile   string
	Pinned    bool
	Policy    Policy
	Timeslice time.Duration
	Pending   bool
}

// Tenant is one tenant's name and class.
type Tenant struct {
	Name       string
	Guaranteed bool
}

// Inventory is what the loop measures: GPUs, instances, tenants.
type Inventory struct {
	GPUs      []GPU
	Instances []Instance
	Tenants   []Tenant
}

// Source returns the current inventory (the manager's records).
type Source interface {
	Inventory(ctx context.Context) (Inventory, error)
}

// SourceFunc adapts a function to Source.
type SourceFunc func(ctx context.Context) (Inventory, error)

// Inventory calls f.
func (f SourceFunc) Inventory(ctx context.Context) (Inventory, error) { return f(ctx) }

// Config configures a Loop. Zero fields take the defaults noted.
type Config struct {
	// Mode: observe, static or adaptive (default adaptive).
	Mode Mode
	// Poll is how often the scheduler logs and clocks are read (default
	// 200ms; the driver's log ring needs five reads a second).
	Poll time.Duration
	// Window is the measurement window (default 1s).
	Window time.Duration
	// TelemetryEvery reads power, temperature and memory every this many
	// windows (default 1).
	TelemetryEvery int
	// SlowEvery reads what moves slowly (power limit, maximum clock, GPU
	// memory, MIG instances' framebuffer use) every this many windows
	// (default 5).
	SlowEvery int
	// SharedPolicy is the policy of GPUs with no starved (adaptive) or no
	// guaranteed (static) instance: best_effort (default) or equal_share.
	SharedPolicy Policy
	// Timeslice, when set, is the time slice set with a policy (clamped to
	// the GPU's capabilities); 0 keeps the driver's default.
	Timeslice time.Duration
	// ARRFrequency, when set and the GPU supports adaptive round robin,
	// sets ARR mode with this scheduling frequency (Hz).
	ARRFrequency uint32
	// Threshold is the interference index above which a guaranteed
	// instance counts as starved (default 0.1).
	Threshold float64
	// Hold is how long a guaranteed instance must stay starved before the
	// adaptive mode switches its GPU to FIXED_SHARE (default 3s).
	Hold time.Duration
	// ReleaseHold is how long a GPU under FIXED_SHARE must see no
	// contention (no instance wanting more than it gets, no guaranteed
	// instance above Release) before the adaptive mode switches back
	// (default 60s).
	ReleaseHold time.Duration
	// Release is the interference index a guaranteed instance must stay
	// under for the switch back (default 0.05).
	Release float64
	// RetryEvery is how often a pending switch is retried while VMs run
	// (it is tried at once when the GPU's last VM stops; default 30s).
	RetryEvery time.Duration
	// Now is the clock (time.Now when nil); tests pass the simulator's.
	Now    func() time.Time
	Logger *slog.Logger
	// OnEvent is told of every policy decision (switched, pending, refused).
	OnEvent func(Event)
	// Guard, when set, runs each of the loop's scheduler changes: it calls
	// set unless an operator pinned the GPU's scheduler meanwhile, and
	// says whether it did (the manager's UnlessPinned). The loop learns of
	// a pin from its inventory only at its next window; the guard keeps it
	// from overriding one in between. Without it the inventory decides.
	Guard func(ctx context.Context, gpu string, set func() error) (bool, error)
}

func (c *Config) defaults() error {
	if c.Mode == "" {
		c.Mode = Adaptive
	}
	if _, err := ParseMode(string(c.Mode)); err != nil {
		return err
	}
	set := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	set(&c.Poll, 200*time.Millisecond)
	set(&c.Window, time.Second)
	set(&c.Hold, 3*time.Second)
	set(&c.ReleaseHold, time.Minute)
	set(&c.RetryEvery, 30*time.Second)
	if c.TelemetryEvery == 0 {
		c.TelemetryEvery = 1
	}
	if c.SlowEvery == 0 {
		c.SlowEvery = 5
	}
	if c.SharedPolicy == "" {
		c.SharedPolicy = BestEffort
	}
	if c.Threshold == 0 {
		c.Threshold = 0.1
	}
	if c.Release == 0 {
		c.Release = 0.05
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.Poll < 10*time.Millisecond || c.Poll > 10*time.Second:
		return fmt.Errorf("%w: poll %v: want 10ms..10s", ErrBadConfig, c.Poll)
	case c.Window < c.Poll || c.Window > time.Hour:
		return fmt.Errorf("%w: window %v: want poll (%v)..1h", ErrBadConfig, c.Window, c.Poll)
	case c.SharedPolicy != BestEffort && c.SharedPolicy != EqualShare:
		return fmt.Errorf("%w: shared policy %q: want best_effort or equal_share", ErrBadConfig, c.SharedPolicy)
	case c.Threshold <= 0 || c.Threshold >= 1 || c.Release <= 0 || c.Release > c.Threshold:
		return fmt.Errorf("%w: thresholds %v/%v: want 0 < release <= threshold < 1", ErrBadConfig, c.Release, c.Threshold)
	case c.Timeslice < 0 || c.TelemetryEvery < 0 || c.SlowEvery < 0:
		return fmt.Errorf("%w: negative timeslice or telemetry interval", ErrBadConfig)
	}
	return nil
}

// Event is a policy decision the loop made.
type Event struct {
	GPU string
	// GPUInstance is the GPU instance whose scheduler it is about; nil for
	// the GPU's own.
	GPUInstance *int
	// Kind: "switched" (the driver took the new policy), "pending" (the
	// driver refused it for now; it is retried), "refused" (it failed
	// otherwise), "cancelled" (no longer wanted while pending).
	Kind     string
	From, To Policy
	Reason   string
	Time     time.Time
}

func (e Event) String() string {
	if e.GPUInstance != nil {
		return fmt.Sprintf("GPU %s GPU instance %d: %s %s -> %s: %s", e.GPU, *e.GPUInstance, e.Kind, e.From, e.To, e.Reason)
	}
	return fmt.Sprintf("GPU %s: %s %s -> %s: %s", e.GPU, e.Kind, e.From, e.To, e.Reason)
}
