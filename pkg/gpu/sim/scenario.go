package sim

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim/workload"
)

// ErrNoSuchScenario is returned by ScenarioByName for an unknown name.
var ErrNoSuchScenario = errors.New("no such scenario")

// Scenario is a seeded, scripted situation on a simulated host: a host
// description, instances carved on it with tenants and workloads, and
// timed events (a VM restarting, a workload changing). Build carves it
// on an open host; the caller advances the clock and runs the events
// (Due) as the simulated time passes them. The simulator's ground truth
// (Truth) says what every instance really got.
type Scenario struct {
	Name        string
	Description string
	Spec        *Spec
	Instances   []ScenarioInstance
	// PowerCaps are power limits in watts by GPU PCI address.
	PowerCaps map[string]int
	Events    []ScenarioEvent
	// Duration is how long the scenario is meant to run.
	Duration time.Duration
}

// ScenarioInstance is one instance of a scenario.
type ScenarioInstance struct {
	// Name is the instance's role ("victim", "noisy").
	Name       string
	Tenant     string
	Guaranteed bool
	// GPU is the PCI address of the GPU it lives on.
	GPU string
	// Profile is a vGPU type name ("L4-12C") or a MIG GPU-instance profile
	// name ("1g.10gb") for a plain MIG instance.
	Profile string
	// Start is a MIG instance's placement (-1: the first free one).
	Start    int
	Workload workload.Workload

	// Set by Build.
	UUID      string // a stable instance UUID
	GPUUUID   string
	Dev       string // what SetWorkload and OpenDevice take: VF address, mdev UUID or GPU/giN
	Key       string // the Truth key
	MIG       bool   // a plain MIG GPU instance
	GIID      int
	VF, Mdev  string
	VMUUID    string
	VMName    string
	TypeID    int
	Compute   uint64 // entitled compute, milli-GPU (as admission records it)
	VRAMBytes uint64
}

// ScenarioEvent is something that happens At a simulated time into the scenario.
type ScenarioEvent struct {
	At   time.Duration
	Name string
	Do   func(h *Host, s *Scenario) error
}

// Instance returns the scenario's instance called name.
func (s *Scenario) Instance(name string) *ScenarioInstance {
	for i := range s.Instances {
		if s.Instances[i].Name == name {
			return &s.Instances[i]
		}
	}
	return nil
}

// Due returns the events with from < At <= to, in order.
func (s *Scenario) Due(from, to time.Duration) []ScenarioEvent {
	var out []ScenarioEvent
	for _, e := range s.Events {
		if e.At > from && e.At <= to {
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out
}

// Build carves the scenario's instances on h (opened from s.Spec), opens a
// VM on each vGPU, sets the workloads and power caps. It fills in the
// instances' host identities.
func (s *Scenario) Build(h *Host) error {
	for i := range s.Instances {
		x := &s.Instances[i]
		if err := h.carve(x); err != nil {
			return fmt.Errorf("scenario %s: instance %s: %w", s.Name, x.Name, err)
		}
		x.UUID = hashUUID("scenario:" + s.Name + ":" + x.Name)
		if !x.MIG {
			x.VMUUID = hashUUID("vm:" + s.Name + ":" + x.Name)
			x.VMName = s.Name + "-" + x.Name
			if err := h.OpenDevice(x.Dev, x.VMUUID, x.VMName); err != nil {
				return fmt.Errorf("scenario %s: start VM of %s: %w", s.Name, x.Name, err)
			}
		}
		if x.Workload.Kind != "" {
			if err := h.SetWorkload(x.Dev, x.Workload); err != nil {
				return fmt.Errorf("scenario %s: workload of %s: %w", s.Name, x.Name, err)
			}
		}
	}
	for pci, w := range s.PowerCaps {
		if err := h.SetPowerCap(pci, w); err != nil {
			return fmt.Errorf("scenario %s: %w", s.Name, err)
		}
	}
	return nil
}

// StopVM stops the instance's VM: its vGPU is inactive until StartVM.
func (x *ScenarioInstance) StopVM(h *Host) error { return h.CloseDevice(x.Dev) }

// StartVM starts the instance's VM again.
func (x *ScenarioInstance) StartVM(h *Host) error { return h.OpenDevice(x.Dev, x.VMUUID, x.VMName) }

// carve creates x on the host the way the kernel and the driver would be
// asked to: a VF type or an mdev through sysfs, a GPU and compute instance
// through NVML.
func (h *Host) carve(x *ScenarioInstance) error {
	var (
		uuid  string
		model string
		mig   bool
	)
	if err := h.view(func(st *state) error {
		g := st.gpu(x.GPU)
		if g == nil {
			return fmt.Errorf("%w: %s", ErrNoSuchGPU, x.GPU)
		}
		uuid, model, mig = g.UUID, g.model.Name, g.MIGCurrent
		return nil
	}); err != nil {
		return err
	}
	x.GPUUUID = uuid
	m, _ := h.cat.Model(model)
	if t, ok := m.VGPUTypeByName(x.Profile); ok {
		x.TypeID, x.VRAMBytes, x.GIID = t.ID, t.FramebufferMiB<<20, -1
		if t.MIGBacked() {
			return fmt.Errorf("MIG-backed vGPU types are not scenario material: %s", x.Profile)
		}
		x.Compute = 1000 / uint64(max(1, t.MaxInstances))
		return h.carveVGPU(x, t.ID)
	}
	if m.MIG == nil || !mig {
		return fmt.Errorf("profile %s is neither a vGPU type of %s nor usable as MIG (MIG off)", x.Profile, model)
	}
	for _, p := range m.MIG.GPUInstanceProfiles {
		if p.Name != x.Profile {
			continue
		}
		x.MIG, x.VRAMBytes = true, p.MemoryMiB<<20
		x.Compute = uint64(p.ComputeSlices) * 1000 / uint64(m.MIG.ComputeSlices)
		return h.carveMIG(x, p.Index)
	}
	return fmt.Errorf("model %s has no vGPU type or MIG profile %q", model, x.Profile)
}

func (h *Host) carveVGPU(x *ScenarioInstance, typeID int) error {
	var flavour string
	var free []string
	if err := h.view(func(st *state) error {
		g := st.gpu(x.GPU)
		flavour = g.Flavour
		if flavour == string(gpu.FlavourVFIO) {
			for _, v := range g.VFs {
				if v.VGPU == nil {
					free = append(free, v.PCI)
				}
			}
		} else {
			for _, p := range g.mdevParents() {
				if g.mdevParentsArePFs() || g.mdevOn(p) == nil {
					free = append(free, p)
				}
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if len(free) == 0 {
		return fmt.Errorf("GPU %s has no free VF or mdev parent", x.GPU)
	}
	fs := h.FS()
	if flavour == string(gpu.FlavourVFIO) {
		x.VF, x.Dev, x.Key = free[0], free[0], free[0]
		return fs.WriteFile("bus/pci/devices/"+free[0]+"/nvidia/current_vgpu_type", []byte(strconv.Itoa(typeID)))
	}
	u := hashUUID("mdev:" + x.GPU + ":" + x.Name + ":" + x.Profile)
	x.Mdev, x.Dev, x.Key = u, u, u
	return fs.WriteFile("class/mdev_bus/"+free[0]+"/mdev_supported_types/nvidia-"+strconv.Itoa(typeID)+"/create", []byte(u))
}

func (h *Host) carveMIG(x *ScenarioInstance, profileIndex int) error {
	lib := h.NVML()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return ret
	}
	defer lib.Shutdown()
	d, ret := lib.DeviceGetHandleByPciBusId(x.GPU)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("device %s: %w", x.GPU, ret)
	}
	info, ret := d.GetGpuInstanceProfileInfo(profileIndex)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("profile %s: %w", x.Profile, ret)
	}
	var g nvml.GpuInstance
	if x.Start >= 0 {
		pls, r := d.GetGpuInstancePossiblePlacements(&info)
		if r != nvml.SUCCESS {
			return fmt.Errorf("placements of %s: %w", x.Profile, r)
		}
		ret = nvml.ERROR_INVALID_ARGUMENT
		for _, p := range pls {
			if int(p.Start) == x.Start {
				g, ret = d.CreateGpuInstanceWithPlacement(&info, &p)
			}
		}
	} else {
		g, ret = d.CreateGpuInstance(&info)
	}
	if ret != nvml.SUCCESS {
		return fmt.Errorf("create GPU instance %s at %d: %w", x.Profile, x.Start, ret)
	}
	gi, ret := g.GetInfo()
	if ret != nvml.SUCCESS {
		return ret
	}
	// The compute instance that spans the whole GPU instance.
	ret = nvml.ERROR_NOT_FOUND
	for idx := 0; idx < nvml.COMPUTE_INSTANCE_PROFILE_COUNT && ret != nvml.SUCCESS; idx++ {
		ci, r := g.GetComputeInstanceProfileInfo(idx, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if r != nvml.SUCCESS || ci.SliceCount != info.SliceCount {
			continue
		}
		_, ret = g.CreateComputeInstance(&ci)
	}
	if ret != nvml.SUCCESS {
		return fmt.Errorf("create compute instance in %s: %w", x.Profile, ret)
	}
	x.GIID = int(gi.Id)
	x.Dev = x.GPU + "/gi" + strconv.Itoa(x.GIID)
	x.Key = migKey(x.GPUUUID, x.GIID)
	return nil
}

// The scenarios. GPUs are named by PCI address on their hosts.
const (
	scenarioL4   = "0000:81:00.0"
	scenarioH100 = "0000:41:00.0"
)

func l4Host() *Spec {
	return &Spec{Version: "v1", GPUs: []GPUSpec{
		{Model: "H100-SXM5-80GB", PCI: scenarioH100, Flavour: gpu.FlavourVFIO, MIG: true},
		{Model: "L4-24GB", PCI: scenarioL4, Flavour: gpu.FlavourVFIO, NUMANode: 1},
	}}
}

// Scenarios returns the built-in scenarios, fresh (Build fills them in).
//
//   - quiet: two guaranteed L4 tenants below their shares and three MIG
//     instances at moderate load; nobody should see interference.
//   - noisy-best-effort: a guaranteed tenant using its whole L4-12C share
//     next to a best-effort noisy neighbour, under the best-effort scheduler.
//   - noisy-adaptive: the same, meant for the share loop's adaptive mode;
//     both VMs restart for maintenance at 20 s, the first moment the driver
//     accepts a scheduler change.
//   - mig-power-cap: a guaranteed 1g.10gb instance saturating its slice
//     next to six noisy 1g neighbours on an H100 capped at 450 W.
func Scenarios() []Scenario {
	steady := func(d float64) workload.Workload { return workload.Workload{Kind: workload.Steady, Demand: d} }
	noisy := workload.Workload{Kind: workload.Noisy}
	victimVsNoisy := func(name, desc string) Scenario {
		return Scenario{Name: name, Description: desc, Spec: l4Host(), Duration: time.Minute,
			Instances: []ScenarioInstance{
				{Name: "victim", Tenant: "acme", Guaranteed: true, GPU: scenarioL4, Profile: "L4-12C", Start: -1, Workload: steady(0.5)},
				{Name: "noisy", Tenant: "crunch", GPU: scenarioL4, Profile: "L4-12C", Start: -1, Workload: noisy},
			}}
	}
	adaptive := victimVsNoisy("noisy-adaptive", "the noisy neighbour under the adaptive share loop; VMs restart at 20 s")
	restart := func(at time.Duration, stop bool) ScenarioEvent {
		name := "maintenance: VMs on the L4 stop"
		if !stop {
			name = "maintenance: VMs on the L4 start again"
		}
		return ScenarioEvent{At: at, Name: name, Do: func(h *Host, s *Scenario) error {
			for _, n := range []string{"victim", "noisy"} {
				x := s.Instance(n)
				var err error
				if stop {
					err = x.StopVM(h)
				} else {
					err = x.StartVM(h)
				}
				if err != nil {
					return err
				}
			}
			return nil
		}}
	}
	adaptive.Events = []ScenarioEvent{restart(20*time.Second, true), restart(21*time.Second, false)}
	migCap := Scenario{Name: "mig-power-cap", Description: "a saturated guaranteed 1g.10gb next to six noisy 1g neighbours, GPU capped at 450 W",
		Spec: l4Host(), Duration: 30 * time.Second, PowerCaps: map[string]int{scenarioH100: 450}}
	migCap.Instances = append(migCap.Instances, ScenarioInstance{Name: "victim", Tenant: "acme", Guaranteed: true, GPU: scenarioH100,
		Profile: "1g.10gb", Start: 0, Workload: steady(1.0 / 7)})
	for i := 1; i < 7; i++ {
		migCap.Instances = append(migCap.Instances, ScenarioInstance{Name: "noisy" + strconv.Itoa(i), Tenant: "crunch", GPU: scenarioH100,
			Profile: "1g.10gb", Start: i, Workload: noisy})
	}
	return []Scenario{
		{Name: "quiet", Description: "tenants below their shares on the L4 and on MIG", Spec: l4Host(), Duration: 30 * time.Second,
			Instances: []ScenarioInstance{
				{Name: "l4-a", Tenant: "acme", Guaranteed: true, GPU: scenarioL4, Profile: "L4-12C", Start: -1, Workload: steady(0.25)},
				{Name: "l4-b", Tenant: "bolt", Guaranteed: true, GPU: scenarioL4, Profile: "L4-12C", Start: -1, Workload: steady(0.3)},
				{Name: "mig-a", Tenant: "acme", Guaranteed: true, GPU: scenarioH100, Profile: "1g.10gb", Start: 0, Workload: steady(0.1)},
				{Name: "mig-b", Tenant: "bolt", Guaranteed: true, GPU: scenarioH100, Profile: "2g.20gb", Start: 2, Workload: steady(0.2)},
				{Name: "mig-c", Tenant: "crunch", GPU: scenarioH100, Profile: "3g.40gb", Start: 4, Workload: workload.Workload{Kind: workload.Bursty, Demand: 0.15, Seed: 7}},
			}},
		victimVsNoisy("noisy-best-effort", "a guaranteed tenant at its full L4-12C share next to a noisy best-effort neighbour"),
		adaptive,
		migCap,
	}
}

// ScenarioByName returns the built-in scenario called name.
func ScenarioByName(name string) (Scenario, error) {
	for _, s := range Scenarios() {
		if s.Name == name {
			return s, nil
		}
	}
	return Scenario{}, fmt.Errorf("%w: %q", ErrNoSuchScenario, name)
}
