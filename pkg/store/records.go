package store

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/vgpud/vgpud/pkg/tenant"
)

// Tenant is a stored tenant.
type Tenant struct {
	tenant.Tenant
	// Generation is set by the store: 1 when the record is created, one
	// more on every put.
	Generation uint64 `json:"generation"`
}

// InstanceKind is how an instance is carved from its GPU.
type InstanceKind string

const (
	KindMIG         InstanceKind = "mig"
	KindVGPU        InstanceKind = "vgpu"
	KindMIGVGPU     InstanceKind = "mig-vgpu"
	KindPassthrough InstanceKind = "passthrough"
)

// InstanceState is where an instance is in its life.
type InstanceState string

const (
	StateCreating   InstanceState = "creating"
	StateReady      InstanceState = "ready"
	StateFailed     InstanceState = "failed"
	StateLost       InstanceState = "lost"
	StateDestroying InstanceState = "destroying"
)

// Flow is the vGPU creation flow (see the host-interfaces reference).
type Flow string

const (
	FlowMdev Flow = "mdev"
	FlowVFIO Flow = "vfio"
)

// Instance is a MIG instance, vGPU or passed-through GPU held by a tenant.
type Instance struct {
	UUID    string       `json:"uuid"`
	Tenant  string       `json:"tenant"`
	Kind    InstanceKind `json:"kind"`
	Profile string       `json:"profile"` // the profile name as requested
	Model   string       `json:"model"`   // catalog model name of the GPU
	GPUUUID string       `json:"gpuUUID"`
	GPUPCI  string       `json:"gpuPCI"`

	// MIG parts; -1 when unused.
	GIProfileID int `json:"giProfileID"`
	GIStart     int `json:"giStart"`
	GISize      int `json:"giSize"`
	GIID        int `json:"giID"`
	CIProfileID int `json:"ciProfileID"`
	CIID        int `json:"ciID"`
	// CIStart and CISlices place a compute instance inside its GPU
	// instance, in compute slices ("1c.3g.40gb": one slice; several such
	// records share one GPU instance). CISlices 0: the compute instance
	// covers the whole GPU instance, as every record written before
	// compute-instance profiles does, so those read unchanged.
	CIStart  int `json:"ciStart,omitempty"`
	CISlices int `json:"ciSlices,omitempty"`

	// vGPU parts.
	TypeID     int    `json:"typeID"`
	TypeName   string `json:"typeName,omitempty"`
	Flow       Flow   `json:"flow,omitempty"`
	MdevUUID   string `json:"mdevUUID,omitempty"`
	MdevParent string `json:"mdevParent,omitempty"`
	VF         string `json:"vf,omitempty"`

	VRAMBytes    uint64 `json:"vramBytes"`
	ComputeMilli uint64 `json:"computeMilli"`

	// FleetConsumer marks an instance created for a fleet scheduler's
	// Placement consumer (placement-consumer): its allocation is the
	// scheduler's, so a create of it cut off by a crash is finished only
	// while that allocation still names it, and the sync never writes the
	// allocation of such a create before it finishes.
	FleetConsumer bool `json:"fleetConsumer,omitempty"`
	// MigrationConsumer is the Placement consumer that holds the
	// instance's allocation while its VM moves to another host (the
	// migration's, as Nova moves an instance's allocation to its
	// migration): the instance's own UUID is then the destination's to
	// claim. Empty: the allocation is the instance UUID's.
	MigrationConsumer string `json:"migrationConsumer,omitempty"`

	State   InstanceState `json:"state"`
	Reason  string        `json:"reason,omitempty"`
	Created time.Time     `json:"created"`
	Updated time.Time     `json:"updated"`
	// Generation is set by the store, as for Tenant.
	Generation uint64 `json:"generation"`
}

// Attachment records that an instance is a hostdev of a libvirt domain.
// An instance has at most one.
//
// Live says the device is also in the running domain (libvirt's live
// definition), not only in its persistent config; the D-Bus Live property
// and the JSON "live" field report it. This is the one meaning of "live"
// in vgpud: operations in flight ("inflight"), the settings a reload
// applies ("reloadable") and the metrics updated as things happen
// ("observed") are named otherwise.
type Attachment struct {
	Instance   string    `json:"instance"` // instance UUID
	Domain     string    `json:"domain"`
	DomainUUID string    `json:"domainUUID"`
	URI        string    `json:"uri"` // libvirt connection URI
	Live       bool      `json:"live"`
	Created    time.Time `json:"created"`
}

// GPU is the state of one GPU that must outlive the daemon and that the
// host does not keep for it: a fault that took it out of service (an XID
// stays a fact after a restart, until an operator clears it), and the vGPU
// mode and scheduler setting the operator chose (the driver forgets both
// at a reboot).
type GPU struct {
	UUID string `json:"uuid"`
	PCI  string `json:"pci,omitempty"`
	// Failed says why carving on the GPU is refused and its instances are
	// failed; "" when it is in service.
	Failed      string    `json:"failed,omitempty"`
	FailedSince time.Time `json:"failedSince,omitempty"`
	// FailedBoot is the host's boot ID when it failed: a reboot resets the
	// GPU, which returns it to service.
	FailedBoot string `json:"failedBoot,omitempty"`
	// Lost: it had fallen off the bus; it is back when it answers again.
	Lost bool `json:"lost,omitempty"`
	// Heterogeneous is the operator's choice of mixed-size time-sliced
	// vGPUs; nil when never set (the driver's default stays).
	Heterogeneous *bool `json:"heterogeneous,omitempty"`
	// Scheduler is the vGPU scheduler setting an operator pinned the GPU
	// to (the driver forgets it at a reboot); nil: the share loop chooses.
	Scheduler *Scheduler `json:"scheduler,omitempty"`
	// GPUInstanceSchedulers are the schedulers an operator pinned for GPU
	// instances of the GPU (Blackwell GB20x: the vGPUs of one GPU instance
	// take turns under its own scheduler), by the GPU instance's profile
	// and placement: the driver forgets a setting with its GPU instance,
	// and vgpud sets it again on the GPU instance re-created there.
	GPUInstanceSchedulers []GPUInstanceScheduler `json:"gpuInstanceSchedulers,omitempty"`
	Updated               time.Time              `json:"updated"`
}

// GPUInstanceScheduler is a pinned scheduler setting of the GPU instance
// of profile ProfileID (the real id) at Start, Size (memory slices).
type GPUInstanceScheduler struct {
	ProfileID int `json:"profileID"`
	Start     int `json:"start"`
	Size      int `json:"size"`
	// GPUInstance is the id of the GPU instance at the placement when it
	// was last seen there (nil in records of older versions): the id an
	// operator names the pin by once that GPU instance is gone.
	GPUInstance *int `json:"gpuInstance,omitempty"`
	Scheduler
}

// Scheduler is a pinned vGPU scheduler setting: policy (pkg/gpu's names)
// and time slice (0: the driver's default).
type Scheduler struct {
	Policy    string        `json:"policy"`
	Timeslice time.Duration `json:"timeslice,omitempty"`
	// Since is when it was pinned.
	Since time.Time `json:"since"`
}

// Zero reports whether the record holds nothing worth keeping.
func (g *GPU) Zero() bool {
	return g.Failed == "" && g.Heterogeneous == nil && g.Scheduler == nil && len(g.GPUInstanceSchedulers) == 0
}

// Op is the operation an intent records.
type Op string

const (
	OpCreate    Op = "create"
	OpDestroy   Op = "destroy"
	OpAttach    Op = "attach"
	OpDetach    Op = "detach"
	OpMove      Op = "move"
	OpReconcile Op = "reconcile"
	// OpCreateAttach spans a create and the attach that follows it: left
	// behind by a crash, the instance it made is destroyed unless attached.
	OpCreateAttach Op = "create-attach"
	// OpMIGMode: a MIG mode change carried through a GPU reset; Instance
	// is the GPU's UUID.
	OpMIGMode Op = "mig-mode"
	// OpOutgoing: the instance's VM is moving to another host; the
	// instance is released when it has left, kept when it stayed.
	OpOutgoing Op = "outgoing"
	// OpIncoming: an instance carved for a VM moving in from another
	// host, the VM's once the VM has arrived, released otherwise.
	OpIncoming Op = "incoming"
)

// Intent is one in-flight operation: what it is, its plan and the steps it
// has finished, so that reconcile can finish or undo it after a crash.
type Intent struct {
	ID       string `json:"id"`
	Op       Op     `json:"op"`
	Instance string `json:"instance,omitempty"`
	// Payload is the operation's plan, opaque to the store; it must be JSON.
	Payload json.RawMessage `json:"payload,omitempty"`
	// Steps are the names of finished steps, in the order they finished.
	Steps   []string  `json:"steps,omitempty"`
	Started time.Time `json:"started"`
	Updated time.Time `json:"updated"`
}

func (in *Instance) validate() error {
	switch {
	case in.UUID == "":
		return fmt.Errorf("%w: instance without a UUID", ErrInvalid)
	case in.Tenant == "":
		return fmt.Errorf("%w: instance %s without a tenant", ErrInvalid, in.UUID)
	}
	switch in.Kind {
	case KindMIG, KindVGPU, KindMIGVGPU, KindPassthrough:
	default:
		return fmt.Errorf("%w: instance %s: kind %q: want mig, vgpu, mig-vgpu or passthrough", ErrInvalid, in.UUID, in.Kind)
	}
	switch in.State {
	case StateCreating, StateReady, StateFailed, StateLost, StateDestroying:
	default:
		return fmt.Errorf("%w: instance %s: state %q: want creating, ready, failed, lost or destroying", ErrInvalid, in.UUID, in.State)
	}
	switch in.Flow {
	case "", FlowMdev, FlowVFIO:
	default:
		return fmt.Errorf("%w: instance %s: flow %q: want mdev, vfio or none", ErrInvalid, in.UUID, in.Flow)
	}
	return nil
}

func (a *Attachment) validate() error {
	switch {
	case a.Instance == "":
		return fmt.Errorf("%w: attachment without an instance", ErrInvalid)
	case a.Domain == "" && a.DomainUUID == "":
		return fmt.Errorf("%w: attachment of instance %s names no domain", ErrInvalid, a.Instance)
	}
	return nil
}

func (it *Intent) validate() error {
	if it.ID == "" {
		return fmt.Errorf("%w: intent without an ID", ErrInvalid)
	}
	switch it.Op {
	case OpCreate, OpDestroy, OpAttach, OpDetach, OpMove, OpReconcile, OpCreateAttach, OpMIGMode, OpOutgoing, OpIncoming:
	default:
		return fmt.Errorf("%w: intent %s: op %q: want create, destroy, attach, detach, move, reconcile, create-attach, mig-mode, outgoing or incoming", ErrInvalid, it.ID, it.Op)
	}
	if len(it.Payload) > 0 && !json.Valid(it.Payload) {
		return fmt.Errorf("%w: intent %s: payload is not JSON", ErrInvalid, it.ID)
	}
	for _, s := range it.Steps {
		if s == "" {
			return fmt.Errorf("%w: intent %s: empty step name", ErrInvalid, it.ID)
		}
	}
	return nil
}
