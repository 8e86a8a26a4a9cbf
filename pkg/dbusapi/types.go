package dbusapi

import (
	"encoding/json"
	"strconv"
	"time"
)

// The client's types. Their JSON form is vgpuctl's -o json output, a
// stable API documented in docs/vgpuctl.md: fields are only added, never
// renamed or removed, within one APIVersion.

// APIVersion is the version of the JSON schema.
const APIVersion = "vgpud.dev/v1"

// Limit is a quota value; Unlimited (UINT64_MAX on the bus) is null in JSON.
type Limit uint64

// Unlimited is the Limit that limits nothing.
const Unlimited = Limit(^uint64(0))

// MarshalJSON writes null for Unlimited.
func (l Limit) MarshalJSON() ([]byte, error) {
	if l == Unlimited {
		return []byte("null"), nil
	}
	return strconv.AppendUint(nil, uint64(l), 10), nil
}

// UnmarshalJSON reads null as Unlimited.
func (l *Limit) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*l = Unlimited
		return nil
	}
	var v uint64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*l = Limit(v)
	return nil
}

// Status is the manager object's state.
type Status struct {
	Version       string `json:"version"`
	DriverVersion string `json:"driverVersion"`
	// Degraded says why carving is refused; empty when healthy.
	Degraded  string `json:"degraded,omitempty"`
	GPUs      int    `json:"gpus"`
	Instances int    `json:"instances"`
	Tenants   int    `json:"tenants"`
}

// GPU is one physical GPU.
type GPU struct {
	PCI          string `json:"pci"`
	UUID         string `json:"uuid"`
	Index        int    `json:"index"`
	Model        string `json:"model"`
	Product      string `json:"product"`
	MemoryBytes  uint64 `json:"memoryBytes"`
	NUMANode     int    `json:"numaNode"`
	KernelDriver string `json:"kernelDriver"`
	// State is ok, lost, failed or passthrough.
	State     string   `json:"state"`
	Reason    string   `json:"reason,omitempty"`
	MIG       GPUMIG   `json:"mig"`
	VGPU      GPUVGPU  `json:"vgpu"`
	Instances []string `json:"instances"`
	Errors    []string `json:"errors,omitempty"`
	// Scheduler is the time-sliced vGPU scheduler's control; nil when the
	// GPU has none (MIG on, no vGPU manager).
	Scheduler *GPUSchedulerState `json:"scheduler,omitempty"`
	// GPUInstanceSchedulers are the schedulers of its GPU instances
	// (Blackwell GB20x only).
	GPUInstanceSchedulers []GPUInstanceScheduler `json:"gpuInstanceSchedulers,omitempty"`
}

// GPUInstanceScheduler is one GPU instance's scheduler control; GPUInstance
// is -1 for a pin whose GPU instance is not on the GPU now.
type GPUInstanceScheduler struct {
	GPUInstance int    `json:"gpuInstance"`
	Profile     string `json:"profile,omitempty"`
	Start       int    `json:"start"`
	Size        int    `json:"size"`
	// LastGPUInstance is, for a pin whose GPU instance is gone, the id
	// that GPU instance last had (the one to drop the pin by); -1 where
	// not known. For a GPU instance on the GPU it is GPUInstance.
	LastGPUInstance int `json:"lastGPUInstance"`
	GPUSchedulerState
}

// GPUSchedulerState is how a GPU's vGPU scheduler is controlled: pinned
// to an operator's policy and time slice (0: the driver's default), or
// adaptive (the share loop chooses); Pending: the pinned setting waits for
// the GPU's VMs to stop.
type GPUSchedulerState struct {
	Mode      string        `json:"mode"`
	Policy    string        `json:"policy,omitempty"`
	Timeslice time.Duration `json:"timesliceNs,omitempty"`
	Pending   bool          `json:"pending,omitempty"`
}

// GPUMIG is a GPU's MIG mode and GPU instances.
type GPUMIG struct {
	Capable   bool          `json:"capable"`
	Enabled   bool          `json:"enabled"`
	Pending   bool          `json:"pending"`
	Instances []GPUInstance `json:"instances"`
}

// GPUInstance is one MIG GPU instance on a GPU.
type GPUInstance struct {
	ID               int    `json:"id"`
	ProfileID        int    `json:"profileID"`
	Profile          string `json:"profile"`
	Start            int    `json:"start"`
	Size             int    `json:"size"`
	ComputeInstances int    `json:"computeInstances"`
}

// GPUVGPU is how a GPU makes vGPUs.
type GPUVGPU struct {
	// Flavour is none, mdev or vfio.
	Flavour       string `json:"flavour"`
	Heterogeneous bool   `json:"heterogeneous"`
	TotalVFs      int    `json:"totalVFs"`
	NumVFs        int    `json:"numVFs"`
}

// Instance is one instance held by a tenant.
type Instance struct {
	UUID    string `json:"uuid"`
	Tenant  string `json:"tenant"`
	Kind    string `json:"kind"`
	Profile string `json:"profile"`
	Model   string `json:"model"`
	// GPU is the PCI address of its GPU.
	GPU          string        `json:"gpu"`
	GPUUUID      string        `json:"gpuUUID"`
	MIG          *InstanceMIG  `json:"mig,omitempty"`
	VGPU         *InstanceVGPU `json:"vgpu,omitempty"`
	VRAMBytes    uint64        `json:"vramBytes"`
	ComputeMilli uint64        `json:"computeMilli"`
	State        string        `json:"state"`
	Reason       string        `json:"reason,omitempty"`
	Created      time.Time     `json:"created"`
	Updated      time.Time     `json:"updated"`
	// Attachment is null when the instance is not attached to a VM.
	Attachment *Attachment `json:"attachment"`
	// PlacementBehind, set only in a create's result, says what the
	// create left Placement behind on (its allocation not written before
	// carving, or the GPU's inventory not published before returning,
	// because Placement did not answer in time); the sync's next pass
	// brings it up to date.
	PlacementBehind string `json:"placementBehind,omitempty"`
}

// InstanceMIG is where a MIG or MIG-backed instance lives on its GPU.
type InstanceMIG struct {
	GPUInstanceProfileID int `json:"gpuInstanceProfileID"`
	Start                int `json:"start"`
	Size                 int `json:"size"`
	GPUInstanceID        int `json:"gpuInstanceID"`
	ComputeInstanceID    int `json:"computeInstanceID"`
	// The compute instance inside the GPU instance (kind mig): its
	// profile id, first compute slice and slices; Slices 0 when it covers
	// the whole GPU instance.
	ComputeInstanceProfileID int `json:"computeInstanceProfileID"`
	ComputeInstanceStart     int `json:"computeInstanceStart"`
	ComputeInstanceSlices    int `json:"computeInstanceSlices"`
}

// InstanceVGPU is a vGPU's type and device.
type InstanceVGPU struct {
	TypeID     int    `json:"typeID"`
	Type       string `json:"type"`
	Flow       string `json:"flow"`
	VF         string `json:"vf,omitempty"`
	MdevUUID   string `json:"mdevUUID,omitempty"`
	MdevParent string `json:"mdevParent,omitempty"`
}

// Attachment is the VM an instance is a hostdev of.
type Attachment struct {
	VM     string    `json:"vm"`
	VMUUID string    `json:"vmUUID"`
	URI    string    `json:"uri"`
	Live   bool      `json:"live"`
	Since  time.Time `json:"since"`
}

// Tenant is one tenant with its quota and usage.
type Tenant struct {
	Name            string   `json:"name"`
	Class           string   `json:"class"`
	Quota           Quota    `json:"quota"`
	Usage           Usage    `json:"usage"`
	AllowedModels   []string `json:"allowedModels"`
	AllowedProfiles []string `json:"allowedProfiles"`
	// NotInCatalog: allowed models and profiles this host's catalog does
	// not have ("model NAME", "profile NAME").
	NotInCatalog []string  `json:"notInCatalog,omitempty"`
	Instances    []string  `json:"instances"`
	Created      time.Time `json:"created"`
}

// Quota bounds a tenant's instances together; null is unlimited.
type Quota struct {
	VRAMBytes    Limit `json:"vramBytes"`
	ComputeMilli Limit `json:"computeMilli"`
	MaxInstances Limit `json:"maxInstances"`
}

// Usage is what a tenant's instances hold.
type Usage struct {
	VRAMBytes    uint64 `json:"vramBytes"`
	ComputeMilli uint64 `json:"computeMilli"`
	Instances    uint64 `json:"instances"`
}

// Profile is one profile a GPU model offers.
type Profile struct {
	Model        string   `json:"model"`
	Name         string   `json:"name"`
	Kind         string   `json:"kind"`
	VRAMBytes    uint64   `json:"vramBytes"`
	ComputeMilli uint64   `json:"computeMilli"`
	MaxPerGPU    int      `json:"maxPerGPU"`
	Flows        []string `json:"flows"`
}

// Capacity is how many more of a profile fit now on one model.
type Capacity struct {
	Model   string `json:"model"`
	Profile string `json:"profile"`
	Kind    string `json:"kind"`
	Count   int    `json:"count"`
	GPUs    int    `json:"gpus"`
}

// Move is one defragmentation move.
type Move struct {
	Instance  string `json:"instance"`
	Profile   string `json:"profile"`
	FromGPU   string `json:"fromGPU"`
	FromStart int    `json:"fromStart"`
	ToGPU     string `json:"toGPU"`
	ToStart   int    `json:"toStart"`
}

// Plan is where a request would go.
type Plan struct {
	Tenant       string     `json:"tenant,omitempty"`
	Profile      string     `json:"profile"`
	Fits         bool       `json:"fits"`
	Model        string     `json:"model,omitempty"`
	GPU          string     `json:"gpu,omitempty"`
	GPUUUID      string     `json:"gpuUUID,omitempty"`
	Start        int        `json:"start"`
	Device       string     `json:"device,omitempty"`
	VRAMBytes    uint64     `json:"vramBytes"`
	ComputeMilli uint64     `json:"computeMilli"`
	Reason       string     `json:"reason,omitempty"`
	Refusal      string     `json:"refusal,omitempty"`
	QuotaOK      bool       `json:"quotaOK"`
	QuotaMessage string     `json:"quotaMessage,omitempty"`
	Moves        []Move     `json:"moves"`
	FreeAfter    []Capacity `json:"freeAfter"`
}

// ReconcileReport is what a reconcile pass found and did.
type ReconcileReport struct {
	DurationSeconds float64   `json:"durationSeconds"`
	Finished        []string  `json:"finished"`
	Undone          []string  `json:"undone"`
	Recreated       []string  `json:"recreated"`
	Lost            []string  `json:"lost"`
	Failed          []string  `json:"failed"`
	Foreign         []Foreign `json:"foreign"`
	Attachments     []string  `json:"attachments"`
	Pending         []string  `json:"pending"`
}

// Foreign is a device vgpud did not create.
type Foreign struct {
	GPU    string `json:"gpu"`
	Kind   string `json:"kind"`
	ID     string `json:"id"`
	Detail string `json:"detail,omitempty"`
}

// ShareRow is one instance's entitled and achieved compute; the pointers
// are null when the share engine does not report them.
type ShareRow struct {
	Instance      string   `json:"instance"`
	EntitledMilli uint64   `json:"entitledMilli"`
	AchievedMilli *float64 `json:"achievedMilli"`
	DemandMilli   *float64 `json:"demandMilli"`
	Interference  *float64 `json:"interference"`
}

// ApplyResult is what Apply reports.
type ApplyResult struct {
	DryRun  bool            `json:"dryRun"`
	Changes json.RawMessage `json:"changes"`
	Result  json.RawMessage `json:"result"`
	Summary string          `json:"summary"`
}

// DefragResult is what Defragment found, and did when applied.
type DefragResult struct {
	Moves   []Move `json:"moves"`
	GPU     string `json:"gpu"`
	Start   int    `json:"start"`
	Applied bool   `json:"applied"`
}

// Event is one signal from vgpud.
type Event struct {
	Time time.Time `json:"time"`
	// Signal is InterfacesAdded, InterfacesRemoved, PropertiesChanged,
	// OperationFinished, OperationFailed, GPULost, VMEvent, PolicySwitched
	// or HostDrift.
	Signal string `json:"signal"`
	// Object is the object path the signal is about; Kind is gpu,
	// instance, tenant or manager, and ID its PCI address, UUID or name.
	Object string `json:"object"`
	Kind   string `json:"kind"`
	ID     string `json:"id,omitempty"`
	// Operation is the operation (OperationFinished/Failed), the VM
	// event (VMEvent) or the drift's kind (HostDrift: missing, foreign).
	Operation string `json:"operation,omitempty"`
	// Message is an error message, a reason or a VM name.
	Message string `json:"message,omitempty"`
	// Changed holds the properties a PropertiesChanged or InterfacesAdded
	// carries, by name.
	Changed map[string]any `json:"changed,omitempty"`
}
