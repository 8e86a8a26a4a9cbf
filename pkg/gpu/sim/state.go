package sim

import (
	"crypto/sha1"
	"fmt"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu/sim/workload"
	"github.com/vgpud/vgpud/pkg/profile"
)

// stateVersion is the on-disk format of state.json.
const stateVersion = 1

// state is the whole simulated host. It is what a real GPU keeps in its
// hardware and driver: it lives in state.json and survives the daemon.
type state struct {
	Version int `json:"version"`
	// Generation increases with every mutation.
	Generation uint64 `json:"generation"`
	// Boot counts simulated boots.
	Boot         int         `json:"boot"`
	Spec         Spec        `json:"spec"`
	DriverLoaded bool        `json:"driverLoaded"`
	GPUs         []*gpuState `json:"gpus"`
	Faults       []Fault     `json:"faults,omitempty"`
	Events       []event     `json:"events,omitempty"`
	NextEvent    uint64      `json:"nextEvent"`
	Uevents      []Uevent    `json:"uevents,omitempty"`
	NextUevent   uint64      `json:"nextUevent"`
	NextHandle   uint32      `json:"nextHandle"`
	NextGroup    int         `json:"nextIommuGroup"`
	// Workloads holds the demand model per vGPU / MIG instance (see
	// workload.go), by mdev UUID, VF address or GPU-UUID/giN. The model's
	// runtime and clock live in the Host (engine.go), not here.
	Workloads map[string]*workload.Workload `json:"workloads,omitempty"`
}

type gpuState struct {
	Model         string `json:"model"`
	PCI           string `json:"pci"`
	UUID          string `json:"uuid"`
	Flavour       string `json:"flavour"`
	NUMANode      int    `json:"numaNode"`
	MIGCurrent    bool   `json:"migCurrent"`
	MIGPending    bool   `json:"migPending"`
	GIs           []*gi  `json:"gpuInstances,omitempty"`
	VFsEnabled    bool   `json:"vfsEnabled"`
	VFs           []*vf  `json:"vfs,omitempty"`
	Mdevs         []*mdv `json:"mdevs,omitempty"`
	Heterogeneous bool   `json:"heterogeneous"`
	Sched         sched  `json:"scheduler"`
	Lost          bool   `json:"lost,omitempty"`
	// Sessions are the NVML clients holding the GPU (sessions.go).
	Sessions   []nvmlSession `json:"nvmlSessions,omitempty"`
	IOMMUGroup int           `json:"iommuGroup"`
	// PowerCapW, when set, throttles the GPU (clock events) under load.
	PowerCapW int `json:"powerCapW,omitempty"`

	model *profile.Model
	// engine is what the workload engine was last told of this GPU, at
	// the state's generation engineGen (engine.go).
	engine    *workload.GPU
	engineGen uint64
}

type gi struct {
	ID        int   `json:"id"`
	ProfileID int   `json:"profileID"`
	Start     int   `json:"start"`
	Size      int   `json:"size"`
	CIs       []*ci `json:"computeInstances,omitempty"`
	// Sched is the GPU instance's own vGPU scheduler (Blackwell GB20x);
	// nil: the driver's default. It goes with the GPU instance.
	Sched *sched `json:"scheduler,omitempty"`
}

type ci struct {
	ID        int `json:"id"`
	ProfileID int `json:"profileID"`
	Start     int `json:"start"`
	Size      int `json:"size"`
}

// vgpu is the driver's record of one vGPU, carried by a VF or an mdev.
type vgpu struct {
	Handle uint32 `json:"handle"`
	UUID   string `json:"uuid"`
	Type   int    `json:"type"`
	// GI is the GPU instance id a MIG-backed vGPU lives on, -1 otherwise.
	GI int `json:"gi"`
	// Placement is the FB slot id (mixed-size / MIG-backed), -1 otherwise.
	Placement int `json:"placement"`
	// VM is the UUID of the VM that has the device open; "" when idle.
	VM     string `json:"vm,omitempty"`
	VMName string `json:"vmName,omitempty"`
	Params string `json:"params,omitempty"`
	// FbUsed is the guest's framebuffer use in bytes.
	FbUsed uint64 `json:"fbUsed,omitempty"`
}

type vf struct {
	PCI        string `json:"pci"`
	IOMMUGroup int    `json:"iommuGroup"`
	VGPU       *vgpu  `json:"vgpu,omitempty"`
	// Params are vgpu_params written before a type (kept across type changes).
	Params string `json:"params,omitempty"`
}

type mdv struct {
	UUID       string `json:"uuid"`
	Parent     string `json:"parent"`
	IOMMUGroup int    `json:"iommuGroup"`
	VGPU       *vgpu  `json:"vgpu"`
}

// sched is the device-level vGPU scheduler state.
type sched struct {
	Policy uint32 `json:"policy"`
	ARR    uint32 `json:"arr"`
	// TimesliceNs is the time slice in ns; 0 means the driver default.
	TimesliceNs uint32 `json:"timesliceNs"`
	AvgFactor   uint32 `json:"avgFactor,omitempty"`
	Frequency   uint32 `json:"frequency,omitempty"`
}

// event is an NVML event waiting to be delivered.
type event struct {
	Seq      uint64 `json:"seq"`
	GPU      string `json:"gpu"`
	Type     uint64 `json:"type"`
	Data     uint64 `json:"data"`
	GI       uint32 `json:"gi"`
	CI       uint32 `json:"ci"`
	UnixNano int64  `json:"t"`
}

// maxEvents bounds the event ring kept in state.json.
const maxEvents = 4096

// Fault is an injected failure or delay. Op is an NVML method name
// ("CreateGpuInstanceWithPlacement"), "*" for every NVML call, or a sysfs
// operation "write:<file>" / "read:<file>" where <file> is the attribute's
// base name ("create", "current_vgpu_type", "remove").
type Fault struct {
	Op string `json:"op"`
	// GPU limits the fault to one GPU (PCI address or UUID); "" for all.
	GPU string `json:"gpu,omitempty"`
	// Return is the NVML return code to fail with (0: none, only delay).
	Return int `json:"return,omitempty"`
	// Errno is the errno a sysfs operation fails with.
	Errno int `json:"errno,omitempty"`
	// Delay is added before the call proceeds or fails ("200ms").
	Delay string `json:"delay,omitempty"`
	// Skip lets this many matching calls through first.
	Skip int `json:"skip,omitempty"`
	// Count is how many times the fault fires; 0 means forever.
	Count int `json:"count,omitempty"`
}

func (f Fault) delay() time.Duration {
	d, _ := time.ParseDuration(f.Delay)
	return d
}

// uuidFor derives a stable GPU UUID from a PCI address, so a simulated
// GPU keeps its UUID across boots as a real one does.
func uuidFor(pci string) string {
	return "GPU-" + hashUUID("gpu:"+pci)
}

func hashUUID(seed string) string {
	h := sha1.Sum([]byte("vgpud-sim:" + seed))
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

func (s *Spec) callLatency() (time.Duration, error) {
	if s.Options.CallLatency == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s.Options.CallLatency)
	if err != nil {
		return 0, err
	}
	if d < 0 || d > 10*time.Second {
		return 0, fmt.Errorf("%v out of range 0..10s", d)
	}
	return d, nil
}

// vgpus returns every vGPU on the GPU, carried by VFs or mdevs.
func (g *gpuState) vgpus() []*vgpu {
	var out []*vgpu
	for _, v := range g.VFs {
		if v.VGPU != nil {
			out = append(out, v.VGPU)
		}
	}
	for _, m := range g.Mdevs {
		out = append(out, m.VGPU)
	}
	return out
}

func (g *gpuState) giByID(id int) *gi {
	for _, x := range g.GIs {
		if x.ID == id {
			return x
		}
	}
	return nil
}

func (x *gi) ciByID(id int) *ci {
	for _, c := range x.CIs {
		if c.ID == id {
			return c
		}
	}
	return nil
}

func (g *gpuState) vfByPCI(pci string) *vf {
	for _, v := range g.VFs {
		if v.PCI == pci {
			return v
		}
	}
	return nil
}
