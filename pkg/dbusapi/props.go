package dbusapi

import (
	"sort"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/vgpud/vgpud/pkg/manager"
)

// propDef is one property as introspection shows it. Every property is
// read-only (changes go through methods, which authorize) and emits
// PropertiesChanged.
type propDef struct {
	name, doc, sig string
	// public properties are readable by anyone (only Manager.Version).
	public bool
}

// prop is a property of an object built from a T; its D-Bus type is the
// type get returns.
type prop[T any] struct {
	name, doc string
	get       func(*T) any
	public    bool
}

func defsOf[T any](ps []prop[T]) []propDef {
	var zero T
	out := make([]propDef, len(ps))
	for i, p := range ps {
		out[i] = propDef{name: p.name, doc: p.doc, sig: dbus.SignatureOf(p.get(&zero)).String(), public: p.public}
	}
	return out
}

func valuesOf[T any](ps []prop[T], v *T) map[string]dbus.Variant {
	out := make(map[string]dbus.Variant, len(ps))
	for _, p := range ps {
		out[p.name] = dbus.MakeVariant(p.get(v))
	}
	return out
}

// usec is a time as systemd's *Timestamp properties carry it: microseconds
// since the epoch, 0 for unset.
func usec(t time.Time) uint64 {
	if t.IsZero() || t.Unix() < 0 {
		return 0
	}
	return uint64(t.UnixMicro())
}

func fromUsec(u uint64) time.Time {
	if u == 0 {
		return time.Time{}
	}
	return time.UnixMicro(int64(u)).UTC()
}

// managerState is what the manager object shows.
type managerState struct {
	version, degraded, driver string
	gpus, instances, tenants  []dbus.ObjectPath
}

var managerProps = []prop[managerState]{
	{name: "Version", doc: "Version of the running vgpud.", public: true, get: func(s *managerState) any { return s.version }},
	{name: "Degraded", doc: "Why carving is refused (the NVIDIA driver did not come up); empty when healthy. Reads work while degraded.", get: func(s *managerState) any { return s.degraded }},
	{name: "DriverVersion", doc: "NVIDIA driver version as NVML reports it.", get: func(s *managerState) any { return s.driver }},
	{name: "GPUs", doc: "Objects of the host's GPUs (dev.vgpud1.GPU).", get: func(s *managerState) any { return nonNilPaths(s.gpus) }},
	{name: "Instances", doc: "Objects of all instances (dev.vgpud1.Instance).", get: func(s *managerState) any { return nonNilPaths(s.instances) }},
	{name: "Tenants", doc: "Objects of all tenants (dev.vgpud1.Tenant).", get: func(s *managerState) any { return nonNilPaths(s.tenants) }},
}

// migInstanceWire is one MIG GPU instance of a GPU: (id, profile id,
// profile name, start slot, size in slots, compute instances).
type migInstanceWire struct {
	ID, ProfileID int32
	Profile       string
	Start, Size   int32
	Compute       int32
}

// giSchedulerWire is one GPU instance's scheduler: (GPU instance id, -1
// while none is at the pinned placement; profile; start slot; size in
// slots; mode; policy; time slice in µs; pending).
type giSchedulerWire struct {
	ID            int32
	Profile       string
	Start, Size   int32
	Mode, Policy  string
	TimesliceUsec uint64
	Pending       bool
}

var gpuProps = []prop[manager.GPUView]{
	{name: "PCI", doc: "PCI address of the physical function, e.g. 0000:41:00.0.", get: func(g *manager.GPUView) any { return g.PCI }},
	{name: "UUID", doc: "GPU UUID (GPU-...).", get: func(g *manager.GPUView) any { return g.UUID }},
	{name: "Index", doc: "NVML index, for display only: it changes when a GPU falls off the bus.", get: func(g *manager.GPUView) any { return int32(g.Index) }},
	{name: "Model", doc: "Catalog model name (H100-SXM5-80GB); empty for a GPU the catalog does not know.", get: func(g *manager.GPUView) any { return g.Model }},
	{name: "Product", doc: "Product name as NVML reports it.", get: func(g *manager.GPUView) any { return g.Product }},
	{name: "MemoryBytes", doc: "Framebuffer size in bytes.", get: func(g *manager.GPUView) any { return g.MemoryBytes }},
	{name: "NUMANode", doc: "NUMA node of the GPU, -1 when unknown.", get: func(g *manager.GPUView) any { return int32(g.NUMANode) }},
	{name: "KernelDriver", doc: "Kernel driver bound to the function (nvidia, vfio-pci).", get: func(g *manager.GPUView) any { return g.KernelDriver }},
	{name: "State", doc: "ok, lost (fell off the bus), failed (an XID or fault; see Reason) or passthrough (given whole to a VM).", get: func(g *manager.GPUView) any { return string(g.State) }},
	{name: "Reason", doc: "Why the GPU is failed; empty otherwise.", get: func(g *manager.GPUView) any { return g.Reason }},
	{name: "MIGCapable", doc: "Whether the GPU supports MIG.", get: func(g *manager.GPUView) any { return g.MIG.Capable }},
	{name: "MIGEnabled", doc: "Whether MIG mode is on.", get: func(g *manager.GPUView) any { return g.MIG.Enabled }},
	{name: "MIGPending", doc: "The MIG mode the GPU takes at its next reset.", get: func(g *manager.GPUView) any { return g.MIG.Pending }},
	{name: "MIGInstances", doc: "MIG GPU instances on the GPU: (id, profile id, profile, start slot, size in slots, compute instances).", get: func(g *manager.GPUView) any {
		out := []migInstanceWire{}
		for _, gi := range g.MIG.Instances {
			out = append(out, migInstanceWire{ID: int32(gi.ID), ProfileID: int32(gi.ProfileID), Profile: gi.Profile,
				Start: int32(gi.Placement.Start), Size: int32(gi.Placement.Size), Compute: int32(len(gi.Compute))})
		}
		return out
	}},
	{name: "VGPUFlavour", doc: "How vGPUs are created on this GPU: none, mdev (mediated devices) or vfio (vendor-specific VFIO on SR-IOV VFs).", get: func(g *manager.GPUView) any { return string(g.VGPU.Flavour) }},
	{name: "Heterogeneous", doc: "Whether time-sliced vGPUs of different sizes may share the GPU.", get: func(g *manager.GPUView) any { return g.VGPU.Heterogeneous }},
	{name: "SchedulerMode", doc: "The time-sliced vGPU scheduler's control: pinned (an operator's policy, which the share loop leaves alone), adaptive (the share loop chooses), or empty when the GPU has no such scheduler (MIG on, no vGPU manager).", get: func(g *manager.GPUView) any { return schedOf(g).Mode }},
	{name: "SchedulerPolicy", doc: "The pinned policy (best_effort, equal_share, fixed_share); empty unless pinned.", get: func(g *manager.GPUView) any { return schedOf(g).Policy }},
	{name: "SchedulerTimesliceUsec", doc: "The pinned time slice in microseconds; 0 for the driver's default.", get: func(g *manager.GPUView) any { return uint64(schedOf(g).Timeslice / time.Microsecond) }},
	{name: "SchedulerPending", doc: "The pinned setting is not on the GPU yet: the driver refuses a change while a VM with a vGPU runs; it is set when they stop.", get: func(g *manager.GPUView) any { return schedOf(g).Pending }},
	{name: "GPUInstanceSchedulers", doc: "The vGPU schedulers of the GPU's GPU instances (Blackwell GB20x; empty elsewhere): (GPU instance id, -1 while no GPU instance is at a pinned placement; profile; start slot; size in slots; mode: pinned or adaptive; pinned policy; pinned time slice in microseconds, 0 for the driver's default; pending: the driver has not taken the pin yet, a VM runs in the GPU instance or none is at the placement).", get: func(g *manager.GPUView) any {
		out := []giSchedulerWire{}
		for _, v := range g.GPUInstanceSchedulers {
			out = append(out, giSchedulerWire{ID: int32(v.GPUInstance), Profile: v.Profile, Start: int32(v.Start), Size: int32(v.Size),
				Mode: v.Mode, Policy: v.Policy, TimesliceUsec: uint64(v.Timeslice / time.Microsecond), Pending: v.Pending})
		}
		return out
	}},
	{name: "GPUInstanceSchedulerLastIDs", doc: "For each entry of GPUInstanceSchedulers, in the same order, the id its GPU instance last had: the entry's own for a GPU instance on the GPU; for a pin whose GPU instance is gone, the id that GPU instance had, by which SetGPUInstanceScheduler drops the pin (-1: not known, a pin recorded by an older version).", get: func(g *manager.GPUView) any {
		out := []int32{}
		for _, v := range g.GPUInstanceSchedulers {
			out = append(out, int32(v.LastGPUInstance))
		}
		return out
	}},
	{name: "TotalVFs", doc: "SR-IOV virtual functions the GPU offers.", get: func(g *manager.GPUView) any { return int32(g.VGPU.TotalVFs) }},
	{name: "NumVFs", doc: "SR-IOV virtual functions enabled now.", get: func(g *manager.GPUView) any { return int32(g.VGPU.NumVFs) }},
	{name: "Instances", doc: "Objects of the vgpud instances on this GPU.", get: func(g *manager.GPUView) any { return instancePaths(g.Instances) }},
	{name: "Errors", doc: "What discovery could not read on this GPU, with the cause.", get: func(g *manager.GPUView) any { return nonNilStrings(g.Errors) }},
}

var instanceProps = []prop[manager.InstanceView]{
	{name: "UUID", doc: "The instance's UUID: its identity in vgpud, libvirt metadata and (for mdev vGPUs) the mdev.", get: func(v *manager.InstanceView) any { return v.UUID }},
	{name: "Tenant", doc: "Name of the tenant holding the instance.", get: func(v *manager.InstanceView) any { return v.Tenant }},
	{name: "TenantObject", doc: "Object of the tenant.", get: func(v *manager.InstanceView) any { return TenantPath(v.Tenant) }},
	{name: "Kind", doc: "mig (compute-only MIG instance), mig-vgpu (MIG-backed vGPU), vgpu (time-sliced vGPU) or passthrough (whole GPU).", get: func(v *manager.InstanceView) any { return string(v.Kind) }},
	{name: "Profile", doc: "Profile as requested (H100-3g.40gb, 1c.3g.40gb, L4-4Q, passthrough), a compute instance as nvidia-smi spells it (01c.3g.40gb as 1c.3g.40gb, 3c.3g.40gb as 3g.40gb).", get: func(v *manager.InstanceView) any { return v.Profile }},
	{name: "Model", doc: "Catalog model of the GPU it lives on.", get: func(v *manager.InstanceView) any { return v.Model }},
	{name: "GPU", doc: "PCI address of its GPU.", get: func(v *manager.InstanceView) any { return v.GPUPCI }},
	{name: "GPUUUID", doc: "UUID of its GPU.", get: func(v *manager.InstanceView) any { return v.GPUUUID }},
	{name: "GPUObject", doc: "Object of its GPU.", get: func(v *manager.InstanceView) any { return GPUPath(v.GPUPCI) }},
	{name: "GPUInstanceProfileID", doc: "MIG GPU-instance profile id; -1 when not MIG.", get: func(v *manager.InstanceView) any { return int32(v.GIProfileID) }},
	{name: "GPUInstanceStart", doc: "First MIG slot of its GPU instance; -1 when not MIG.", get: func(v *manager.InstanceView) any { return int32(v.GIStart) }},
	{name: "GPUInstanceSize", doc: "MIG slots of its GPU instance; 0 when not MIG.", get: func(v *manager.InstanceView) any { return int32(v.GISize) }},
	{name: "GPUInstanceID", doc: "Driver id of its GPU instance (changes across reboots); -1 when none.", get: func(v *manager.InstanceView) any { return int32(v.GIID) }},
	{name: "ComputeInstanceID", doc: "Driver id of its compute instance; -1 when none.", get: func(v *manager.InstanceView) any { return int32(v.CIID) }},
	{name: "ComputeInstanceProfileID", doc: "Compute-instance profile id of its compute instance (0 for 1c, 1 for 2c, ...); -1 when none or not yet known.", get: func(v *manager.InstanceView) any { return int32(v.CIProfileID) }},
	{name: "ComputeInstanceStart", doc: "First compute slice of its compute instance inside its GPU instance (kind mig).", get: func(v *manager.InstanceView) any { return int32(v.CIStart) }},
	{name: "ComputeInstanceSlices", doc: "Compute slices of its compute instance (1 for 1c.3g.40gb); 0 when it covers its whole GPU instance or there is none.", get: func(v *manager.InstanceView) any { return int32(v.CISlices) }},
	{name: "VGPUTypeID", doc: "vGPU type id; 0 when not a vGPU.", get: func(v *manager.InstanceView) any { return int32(v.TypeID) }},
	{name: "VGPUType", doc: "vGPU type name; empty when not a vGPU.", get: func(v *manager.InstanceView) any { return v.TypeName }},
	{name: "Flow", doc: "vGPU creation flow: mdev or vfio; empty when not a vGPU.", get: func(v *manager.InstanceView) any { return string(v.Flow) }},
	{name: "VF", doc: "PCI address of its SR-IOV virtual function (vfio flow).", get: func(v *manager.InstanceView) any { return v.VF }},
	{name: "MdevUUID", doc: "UUID of its mediated device (mdev flow).", get: func(v *manager.InstanceView) any { return v.MdevUUID }},
	{name: "MdevParent", doc: "PCI address of its mdev parent (mdev flow).", get: func(v *manager.InstanceView) any { return v.MdevParent }},
	{name: "VRAMBytes", doc: "Framebuffer the instance holds, counted against the tenant's VRAM quota.", get: func(v *manager.InstanceView) any { return v.VRAMBytes }},
	{name: "ComputeMilli", doc: "Entitled compute in milli-GPU (1000 = one GPU), counted against the tenant's compute quota.", get: func(v *manager.InstanceView) any { return v.ComputeMilli }},
	{name: "State", doc: "creating, ready, failed, lost or destroying.", get: func(v *manager.InstanceView) any { return string(v.State) }},
	{name: "Reason", doc: "Why the instance is where it is (placement reason, failure).", get: func(v *manager.InstanceView) any { return v.Reason }},
	{name: "CreatedTimestamp", doc: "When the instance was created, in microseconds since the epoch.", get: func(v *manager.InstanceView) any { return usec(v.Created) }},
	{name: "UpdatedTimestamp", doc: "When its record last changed, in microseconds since the epoch.", get: func(v *manager.InstanceView) any { return usec(v.Updated) }},
	{name: "VM", doc: "Name of the libvirt domain it is attached to; empty when not attached.", get: func(v *manager.InstanceView) any {
		if v.Attachment == nil {
			return ""
		}
		return v.Attachment.Domain
	}},
	{name: "VMUUID", doc: "UUID of that domain.", get: func(v *manager.InstanceView) any {
		if v.Attachment == nil {
			return ""
		}
		return v.Attachment.DomainUUID
	}},
	{name: "VMURI", doc: "libvirt connection URI of that domain.", get: func(v *manager.InstanceView) any {
		if v.Attachment == nil {
			return ""
		}
		return v.Attachment.URI
	}},
	{name: "Live", doc: "Whether the device is also in the running domain (not only in its configuration).", get: func(v *manager.InstanceView) any {
		return v.Attachment != nil && v.Attachment.Live
	}},
	{name: "AttachedTimestamp", doc: "When it was attached, in microseconds since the epoch; 0 when not attached.", get: func(v *manager.InstanceView) any {
		if v.Attachment == nil {
			return uint64(0)
		}
		return usec(v.Attachment.Created)
	}},
}

// tenantState is a tenant with the objects of its instances.
type tenantState struct {
	manager.TenantView
	instances []dbus.ObjectPath
}

var tenantProps = []prop[tenantState]{
	{name: "Name", doc: "Tenant name (a DNS label).", get: func(t *tenantState) any { return t.Name }},
	{name: "Class", doc: "guaranteed (entitled to its instances' compute share) or best-effort.", get: func(t *tenantState) any { return string(t.Class) }},
	{name: "VRAMQuota", doc: "VRAM quota in bytes; 18446744073709551615 (UINT64_MAX) is unlimited.", get: func(t *tenantState) any { return t.Quota.VRAMBytes }},
	{name: "ComputeQuota", doc: "Compute quota in milli-GPU; UINT64_MAX is unlimited.", get: func(t *tenantState) any { return t.Quota.ComputeMilli }},
	{name: "MaxInstances", doc: "Instance count quota; UINT64_MAX is unlimited.", get: func(t *tenantState) any { return t.Quota.MaxInstances }},
	{name: "VRAMUsed", doc: "VRAM its instances hold, in bytes.", get: func(t *tenantState) any { return t.Usage.VRAMBytes }},
	{name: "ComputeUsed", doc: "Entitled compute its instances hold, in milli-GPU.", get: func(t *tenantState) any { return t.Usage.ComputeMilli }},
	{name: "InstancesUsed", doc: "Number of its instances.", get: func(t *tenantState) any { return t.Usage.Instances }},
	{name: "AllowedModels", doc: "GPU models it may use; empty allows any.", get: func(t *tenantState) any { return nonNilStrings(t.AllowedModels) }},
	{name: "AllowedProfiles", doc: "Profiles it may use; empty allows any.", get: func(t *tenantState) any { return nonNilStrings(t.AllowedProfiles) }},
	{name: "NotInCatalog", doc: "Allowed models and profiles this host's catalog does not have (\"model NAME\", \"profile NAME\"): kept for fleet-wide tenant definitions, but they allow nothing here.", get: func(t *tenantState) any { return nonNilStrings(t.NotInCatalog) }},
	{name: "Instances", doc: "Objects of its instances.", get: func(t *tenantState) any { return nonNilPaths(t.instances) }},
	{name: "CreatedTimestamp", doc: "When it was defined, in microseconds since the epoch.", get: func(t *tenantState) any { return usec(t.Created) }},
}

func instancePaths(ids []string) []dbus.ObjectPath {
	out := make([]dbus.ObjectPath, 0, len(ids))
	for _, id := range ids {
		out = append(out, InstancePath(id))
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func nonNilPaths(p []dbus.ObjectPath) []dbus.ObjectPath {
	if p == nil {
		return []dbus.ObjectPath{}
	}
	return p
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func schedOf(g *manager.GPUView) manager.SchedulerView {
	if g.Scheduler == nil {
		return manager.SchedulerView{}
	}
	return *g.Scheduler
}
