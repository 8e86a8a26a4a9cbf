package dbusapi

import "github.com/godbus/dbus/v5"

// D-Bus structs of the Manager's methods. Field order is the struct's
// D-Bus signature; the client decodes into the same types.

// gpuEntry is one ListGPUs row: (pci, uuid, model, state, instances, object).
type gpuEntry struct {
	PCI, UUID, Model, State string
	Instances               uint32
	Object                  dbus.ObjectPath
}

// instanceEntry is one ListInstances row: (uuid, tenant, profile, kind,
// gpu, state, vm, object).
type instanceEntry struct {
	UUID, Tenant, Profile, Kind, GPU, State, VM string
	Object                                      dbus.ObjectPath
}

// tenantEntry is one ListTenants row: (name, class, instances, object).
type tenantEntry struct {
	Name, Class string
	Instances   uint32
	Object      dbus.ObjectPath
}

// profileEntry is one ListProfiles row: (model, name, kind, vram bytes,
// compute milli-GPU, max per GPU, flows).
type profileEntry struct {
	Model, Name, Kind  string
	VRAMBytes, Compute uint64
	MaxPerGPU          int32
	Flows              string
}

// capacityEntry is one GetCapacity row: (model, profile, kind, how many
// more fit, on how many GPUs).
type capacityEntry struct {
	Model, Profile, Kind string
	Count, GPUs          uint32
}

// moveEntry is one defragmentation move: (instance, profile, from GPU,
// from slot, to GPU, to slot).
type moveEntry struct {
	Instance, Profile, FromGPU string
	FromStart                  int32
	ToGPU                      string
	ToStart                    int32
}

// foreignEntry is one device reconcile found that vgpud did not create:
// (gpu, kind, id, detail).
type foreignEntry struct {
	GPU, Kind, ID, Detail string
}

// shareEntry is one GetShares row: (instance, entitled milli-GPU, achieved
// milli-GPU, demand milli-GPU, interference index); negative doubles are
// unknown.
type shareEntry struct {
	Instance     string
	Entitled     uint64
	Achieved     float64
	Demand       float64
	Interference float64
}
