package dbusapi

// interfaces declares the API: every interface, method, argument,
// property and signal with its documentation. The Go functions named by fn
// are in methods.go and standard.go.
func (s *Service) interfaces() map[string]*ifaceDef {
	optsArg := arg{name: "options", doc: "Options (a{sv}): " + OptTimeout + " (t, the caller's timeout in milliseconds; the operation is cancelled and undone when it passes), " + OptOperationID + " (s, a name Cancel can stop it by), and the method's own, listed in its documentation. Unknown keys are refused."}
	instArg := arg{name: "instance", doc: "Instance UUID.", max: maxID}
	gpuArg := arg{name: "gpu", doc: "GPU by PCI address, UUID or NVML index.", max: maxID}
	vmArg := arg{name: "vm", doc: "libvirt domain name, or URI/name for a domain of this host's libvirt."}

	mgr := &ifaceDef{
		name: ManagerInterface,
		doc:  "vgpud's manager: GPUs carved into MIG instances and vGPUs, attached to libvirt VMs, held to tenant quotas. Reads need root or group vgpud; changes need root, group vgpud (unless groupAccess is read) or the polkit action dev.vgpud1.manage; GetAccess says which the caller has. Errors are dev.vgpud1.Error.{QuotaExceeded,NoCapacity,NotFound,InvalidArgument,AccessDenied,Busy,Conflict,GPULost,BackendFailure,StaleClaim}, whose message says what to do next.",
		methods: []*methodDef{
			{name: "ListGPUs", access: accessRead, fn: s.listGPUs,
				doc: "The host's GPUs.",
				out: []arg{{name: "gpus", doc: "(pci, uuid, model, state, instances, object) per GPU."}}},
			{name: "ListInstances", access: accessRead, fn: s.listInstances,
				doc: "The instances, of one tenant or all.",
				in:  []arg{{name: "tenant", doc: "Tenant name; empty for all tenants."}},
				out: []arg{{name: "instances", doc: "(uuid, tenant, profile, kind, gpu, state, vm, object) per instance; vm is empty when not attached."}}},
			{name: "ListTenants", access: accessRead, fn: s.listTenants,
				doc: "The tenants.",
				out: []arg{{name: "tenants", doc: "(name, class, instances, object) per tenant."}}},
			{name: "ListProfiles", access: accessRead, fn: s.listProfiles,
				doc: "The profiles (MIG GPU- and compute-instance profiles, vGPU types, passthrough) of the GPU models on this host.",
				in:  []arg{{name: "gpu", doc: "Only this GPU's model (PCI address, UUID or index); empty for all."}},
				out: []arg{{name: "profiles", doc: "(model, name, kind, vram bytes, compute milli-GPU, max per GPU, flows) per profile."}}},
			{name: "GetCapacity", access: accessRead, fn: s.getCapacity,
				doc: "How many more instances of each profile fit now, per GPU model: the placement inventory orchestrators report. Each profile is counted on its own (placing one changes the others' counts).",
				out: []arg{{name: "capacity", doc: "(model, profile, kind, count, gpus): count more fit, spread over gpus GPUs."}}},
			{name: "Plan", access: accessRead, fn: s.plan,
				doc: "Where a request would go and what would stay free; nothing changes. Options: gpu (s) pins the GPU.",
				in:  []arg{{name: "tenant", doc: "Tenant whose quota is checked; empty to skip the quota."}, {name: "profile", doc: "Profile to place."}, optsArg},
				out: []arg{
					{name: "fits", doc: "Whether the host has room for it now."},
					{name: "model", doc: "Model of the chosen GPU."},
					{name: "gpu", doc: "PCI address of the chosen GPU."},
					{name: "gpu_uuid", doc: "UUID of the chosen GPU."},
					{name: "start", doc: "First MIG slot; -1 when not MIG."},
					{name: "device", doc: "SR-IOV VF or mdev parent the vGPU would use; empty when none."},
					{name: "vram_bytes", doc: "VRAM it would take of the quota."},
					{name: "compute_milli", doc: "Compute it would take of the quota, in milli-GPU."},
					{name: "reason", doc: "Why that GPU and slot."},
					{name: "refusal", doc: "Why it does not fit, with the next step; empty when it fits."},
					{name: "quota_ok", doc: "Whether the tenant's quota admits it."},
					{name: "quota_message", doc: "What the quota lacks; empty when it admits it."},
					{name: "moves", doc: "Moves of movable MIG instances that would make room (see Defragment): (instance, profile, from gpu, from slot, to gpu, to slot)."},
					{name: "free_after", doc: "Capacity left once it is placed, as GetCapacity."},
				}},
			{name: "CreateInstance", access: accessManage, fn: s.createInstance,
				doc: "Admit (quota and capacity, atomically with other requests) and carve one instance. A compute-instance profile (`1c.3g.40gb`) goes into a GPU instance of the tenant's with room, else into a new one. A failure undoes every finished step. Options: gpu (s) pins the GPU; uuid (s) sets the instance's UUID, making retries idempotent (the nil UUID is InvalidArgument; the UUID of an mdev vgpud did not create, mdevctl's say, is Conflict: vgpud never takes over another's device); affinity (s): none, spread or pack; placement-consumer (s): the consumer UUID of a Placement allocation a fleet scheduler wrote, which the create honours or refuses (NotFound: no allocation; InvalidArgument: another host, class or GPU than the gpu option; StaleClaim: the host no longer has that room, or the allocation was deleted while the create ran, and nothing is left on the host); it becomes the instance's UUID.",
				in:  []arg{{name: "tenant", doc: "Tenant that holds it."}, {name: "profile", doc: "Profile: a MIG profile (3g.40gb, H100-3g.40gb, MODEL/3g.40gb), a vGPU type (L4-4Q) or passthrough."}, optsArg},
				out: []arg{{name: "object", doc: "Object of the new instance."}, {name: "uuid", doc: "Its UUID."}}},
			{name: "DestroyInstance", access: accessManage, fn: s.destroyInstance,
				doc: "Release an instance from the host and forget it. An attached instance is refused (Busy) unless option detach (b) is true.",
				in:  []arg{instArg, optsArg}},
			{name: "Attach", access: accessManage, fn: s.attach,
				doc: "Make an instance a hostdev of a VM: in its persistent configuration, and live when it runs. Repeating it is a no-op; another VM is Conflict. Options: display (b) turns on a Q-series mdev's display; ramfb (b) adds a boot framebuffer to it (implies display); tenant (s) must own the instance.",
				in:  []arg{instArg, vmArg, optsArg},
				out: []arg{{name: "vm_uuid", doc: "UUID of the domain."}, {name: "live", doc: "Whether the device is also in the running domain."}}},
			{name: "CreateAndAttach", access: accessManage, fn: s.createAndAttach,
				doc: "CreateInstance then Attach; when the attach fails the instance is destroyed again. Options: those of CreateInstance, display (b) and ramfb (b).",
				in:  []arg{{name: "tenant", doc: "Tenant that holds it."}, {name: "profile", doc: "Profile, as for CreateInstance."}, vmArg, optsArg},
				out: []arg{{name: "object", doc: "Object of the new instance."}, {name: "uuid", doc: "Its UUID."}, {name: "live", doc: "Whether the device is also in the running domain."}}},
			{name: "Detach", access: accessManage, fn: s.detach,
				doc: "Remove an instance from its VM (live, waiting for the guest to release it, then the configuration). NotFound when it is not attached.",
				in:  []arg{instArg, optsArg}},
			{name: "GetAccess", access: accessPublic, fn: s.getAccess,
				doc: "What the caller may do, and why not: the refusal a read or a change would get. Anyone may ask; polkit is asked without interaction, so a change polkit would allow only after a password reads as not allowed.",
				out: []arg{{name: "can_read", doc: "Whether the caller may read (root, group vgpud)."},
					{name: "can_manage", doc: "Whether the caller may change state (root, group vgpud unless groupAccess is read, polkit's dev.vgpud1.manage)."},
					{name: "reason", doc: "Why not, with what to ask for; empty when the caller may read and change."}}},
			{name: "ListDomains", access: accessRead, fn: s.listDomains,
				doc: "The VMs of this host's libvirt, to choose one to attach to. BackendFailure when libvirt is not configured or does not answer.",
				in:  []arg{optsArg},
				out: []arg{{name: "domains", doc: "(name, uuid, state) per domain; state is running (active: running or paused) or shut off."}}},
			{name: "GetHostdevXML", access: accessRead, fn: s.hostdevXML,
				doc: "The libvirt <hostdev> element the instance is attached as (what virsh attach-device takes).",
				in:  []arg{instArg},
				out: []arg{{name: "xml", doc: "The <hostdev> element."}}},
			{name: "DefineTenant", access: accessManage, fn: s.defineTenant,
				doc: "Define a tenant. The same definition again is a no-op; other settings are Conflict (use SetQuota). Options: allowed-models (as), allowed-profiles (as), unlimited (as): quotas to make unlimited whatever their argument says, of vram, compute and instances (for clients that cannot send UINT64_MAX).",
				in: []arg{{name: "name", doc: "Tenant name: a DNS label."},
					{name: "vram_bytes", doc: "VRAM quota in bytes; UINT64_MAX is unlimited."},
					{name: "compute_milli", doc: "Compute quota in milli-GPU (1000 = one GPU); UINT64_MAX is unlimited."},
					{name: "max_instances", doc: "Instance count quota; UINT64_MAX is unlimited."},
					{name: "class", doc: "guaranteed or best-effort; empty is best-effort."}, optsArg},
				out: []arg{{name: "object", doc: "Object of the tenant."}}},
			{name: "SetQuota", access: accessManage, fn: s.setQuota,
				doc: "Replace a tenant's quota. A quota below what the tenant holds is accepted: its instances stay, new ones are refused. Options: unlimited (as), as for DefineTenant.",
				in: []arg{{name: "name", doc: "Tenant name."},
					{name: "vram_bytes", doc: "VRAM quota in bytes; UINT64_MAX is unlimited."},
					{name: "compute_milli", doc: "Compute quota in milli-GPU; UINT64_MAX is unlimited."},
					{name: "max_instances", doc: "Instance count quota; UINT64_MAX is unlimited."}, optsArg}},
			{name: "UndefineTenant", access: accessManage, fn: s.undefineTenant,
				doc: "Remove a tenant. One that owns instances is refused (Busy) unless force, which detaches and destroys them first.",
				in:  []arg{{name: "name", doc: "Tenant name."}, {name: "force", doc: "Destroy its instances first."}, optsArg}},
			// A dry run only computes, so it needs what reading needs
			// (and a polkit-only caller, who may not read, gets no diff).
			{name: "Apply", access: accessManage, fn: s.apply,
				readIf: func(args []any) bool { dry, _ := args[2].(bool); return dry }, readIfDoc: "dry_run",
				doc: "Make the host match a declarative configuration (vgpud's own format, or NVIDIA mig-parted and vgpu-device-manager files). Options: name (s), the file name, for format detection and messages. Cancelled (the caller's timeout, Cancel, the caller leaving), it begins no further change and the changes it made stay: an apply is a series of operations, each finished or undone on its own, not undone as a whole.",
				in:  []arg{{name: "data", doc: "The configuration file's content (at most 4 MiB).", max: maxDocument}, {name: "select", doc: "Which named configuration of the file to apply; empty for the file's default."}, {name: "dry_run", doc: "Only compute the changes."}, optsArg},
				out: []arg{{name: "changes", doc: "The change set as JSON (docs/dbus-api.md)."}, {name: "result", doc: "What was done, as JSON; \"null\" for a dry run."}, {name: "summary", doc: "The changes as text, one per line."}}},
			{name: "Reconcile", access: accessManage, fn: s.reconcile,
				doc: "Compare the records with the host now: finish or undo interrupted operations, re-create instances a reboot lost, report devices vgpud did not create.",
				in:  []arg{optsArg},
				out: []arg{
					{name: "duration_usec", doc: "How long it took."},
					{name: "finished", doc: "Intents rolled forward."},
					{name: "undone", doc: "Intents rolled back."},
					{name: "recreated", doc: "Instances re-created."},
					{name: "lost", doc: "Instances whose GPU is gone."},
					{name: "failed", doc: "Instances vgpud could not restore."},
					{name: "foreign", doc: "Devices vgpud did not create: (gpu, kind, id, detail)."},
					{name: "attachments", doc: "Attachment records fixed to match libvirt."},
					{name: "pending", doc: "Interrupted operations left for a later pass (libvirt not connected, a host call failing), each with why."},
				}},
			{name: "Defragment", access: accessManage, fn: s.defragment,
				readIf: func(args []any) bool { apply, _ := args[2].(bool); return !apply }, readIfDoc: "not apply",
				doc: "Which moves of movable MIG instances (not in a running VM) would admit a request refused for fragmentation; with apply, perform them (each instance keeps its identity). Options: gpu (s).",
				in:  []arg{{name: "tenant", doc: "Tenant of the request."}, {name: "profile", doc: "Profile of the request."}, {name: "apply", doc: "Perform the moves."}, optsArg},
				out: []arg{{name: "moves", doc: "(instance, profile, from gpu, from slot, to gpu, to slot)."}, {name: "gpu", doc: "GPU the request fits on after the moves."}, {name: "start", doc: "Its first slot there."}, {name: "applied", doc: "Whether the moves were performed."}}},
			{name: "SetMIGMode", access: accessManage, fn: s.setMIGMode,
				doc: "Enable or disable MIG on a GPU. Refused while vgpud instances live on it. A change the driver leaves pending a GPU reset is carried through by vgpud (VFs off, reset, VFs on, settings set again; docs/operations.md); Busy naming what holds the GPU when something outside vgpud does (a running VM, a foreign vGPU or mdev, another NVML client), and Busy with the manual steps under `gpuReset: never`.",
				in:  []arg{gpuArg, {name: "enabled", doc: "MIG on or off."}, optsArg}},
			{name: "SetHeterogeneous", access: accessManage, fn: s.setHeterogeneous,
				doc: "Let time-sliced vGPUs of different sizes share a GPU, or not; refused while vGPUs exist on it.",
				in:  []arg{gpuArg, {name: "enabled", doc: "Mixed sizes on or off."}, optsArg}},
			{name: "SetGPUScheduler", access: accessManage, fn: s.setGPUScheduler,
				doc: "Pin a GPU's time-sliced vGPU scheduler to a policy and time slice (the share loop then leaves it alone), or hand it to the share loop (mode adaptive). Kept across restarts and set again after a reboot. The driver takes a change only while no VM with a vGPU runs on the GPU: the setting is then pending, and set when they stop. InvalidArgument for a GPU without a time-sliced scheduler (MIG on, no vGPU manager), or a time slice outside 1 ms..30 ms (both ends included), before anything changes; SchedulerTimesliceUsec then shows the slice the driver holds.",
				in: []arg{gpuArg, {name: "mode", doc: "pinned, adaptive, or empty (pinned when a policy is given).", max: maxID},
					{name: "policy", doc: "best_effort, equal_share or fixed_share; empty with adaptive.", max: maxID},
					{name: "timeslice_usec", doc: "Time slice in microseconds, 1000..30000 (both ends included); 0 for the driver's default. InvalidArgument outside that range, before anything changes."}, optsArg},
				out: []arg{{name: "mode", doc: "The GPU's scheduler mode now: pinned or adaptive."},
					{name: "pending", doc: "The pinned setting waits for the GPU's VMs to stop."},
					{name: "detail", doc: "Why it is pending; empty otherwise."}}},
			{name: "SetGPUInstanceScheduler", access: accessManage, fn: s.setGPUInstanceScheduler,
				doc: "Pin the vGPU scheduler of one GPU instance (Blackwell GB20x, e.g. RTX PRO 6000 Blackwell: the vGPUs of a GPU instance take turns under its own scheduler) to a policy and time slice, or drop the pin (mode adaptive: the share loop steers it, where the driver allows). Kept across restarts by the GPU instance's profile and placement, and set again on the GPU instance there after it is re-created or the driver reloads; dropped, with a PolicySwitched event, when vgpud destroys the GPU instance (its last instance destroyed) or turns MIG off on the GPU. The driver takes a change only while no VM runs in the GPU instance: the setting is then pending, and set when it stops. Mode adaptive with the id of a GPU instance that is gone (GPUInstanceSchedulerLastIDs) drops that GPU instance's pin, MIG on or off. Refused before anything changes: InvalidArgument for a GPU without per-GPU-instance schedulers (not GB20x, MIG off), a GPU instance that hosts no vGPU, a negative GPU instance id, a bad mode or policy, or a time slice outside 1 ms..30 ms; NotFound for a GPU the host does not have, or a GPU instance it does not have and, for adaptive, no pin of a gone GPU instance of that id. The GPU's GPUInstanceSchedulers property shows the result.",
				in: []arg{gpuArg, {name: "gpu_instance", doc: "The GPU instance id (the first field of MIGInstances)."},
					{name: "mode", doc: "pinned, adaptive, or empty (pinned when a policy is given).", max: maxID},
					{name: "policy", doc: "best_effort, equal_share or fixed_share; empty with adaptive.", max: maxID},
					{name: "timeslice_usec", doc: "Time slice in microseconds, 1000..30000 (both ends included); 0 for the driver's default."}, optsArg},
				out: []arg{{name: "mode", doc: "The GPU instance's scheduler mode now: pinned or adaptive."},
					{name: "pending", doc: "The pinned setting waits for the GPU instance's VM to stop."},
					{name: "detail", doc: "Why it is pending; empty otherwise."}}},
			{name: "ClearGPU", access: accessManage, fn: s.clearGPU,
				doc: "Return a failed GPU (a critical XID) to service after an operator checked or reset it, and reconcile, which brings its instances back. A lost GPU returns by itself when it answers (GPULost otherwise).",
				in:  []arg{gpuArg, optsArg}},
			{name: "GetFleetStatus", access: accessRead, fn: s.getFleetStatus,
				doc: "What OpenStack Placement holds against what the host holds (docs/fleet.md): the GPU providers, their inventories and allocations, and every difference named. Only reads: the sync repairs differences at its next pass. Unavailable when no fleet is configured or Placement does not answer.",
				out: []arg{
					{name: "endpoint", doc: "Placement's URL."},
					{name: "host", doc: "Host name the providers are named after."},
					{name: "root", doc: "UUID of the provider the GPU providers hang under."},
					{name: "last_sync_ms", doc: "Last successful sync pass, Unix milliseconds; 0 before the first."},
					{name: "last_error", doc: "The last pass's error; empty when it succeeded."},
					{name: "providers", doc: "(uuid, name, gpu, in placement, host allocations, placement allocations, classes) per GPU; classes: (class, host total, host reserved, host max_unit, placement total, placement reserved, placement used)."},
					{name: "differences", doc: "(kind, provider, subject, host, placement): kind is provider-missing, provider-stale, inventory-missing, inventory-stale, inventory-differs, traits-differ, allocation-missing, allocation-stale, allocation-differs or write-failed (a write the last pass could not make; host: the write, placement: the error); subject the class, consumer or provider UUID; empty when Placement equals the host."},
				}},
			{name: "GetShares", access: accessRead, fn: s.getShares,
				doc: "Per instance: entitled compute and, when the share engine reports them, achieved compute, demand and interference index (max(0, 1 - achieved/min(demand, entitled)); 0 is perfect isolation) over the last window.",
				out: []arg{{name: "shares", doc: "(instance, entitled milli-GPU, achieved milli-GPU, demand milli-GPU, interference); negative values are unknown."}}},
			{name: "Cancel", access: accessManage, fn: s.cancelOp,
				doc: "Cancel the operation started with that operation-id option; it undoes what it did. Only the user who started it, or root, may. It takes no options: it answers at once.",
				in:  []arg{{name: "operation_id", doc: "The operation-id the operation was started with.", max: maxID}}},
		},
		props: defsOf(managerProps),
		signals: []signalDef{
			{name: "OperationFinished", doc: "An operation finished.", args: []arg{
				{name: "operation", sig: "s", doc: "create, destroy, attach, detach, ..."}, {name: "id", sig: "s", doc: "Instance UUID (or tenant, GPU) it was about."}}},
			{name: "OperationFailed", doc: "An operation failed; what it did was undone.", args: []arg{
				{name: "operation", sig: "s", doc: "create, destroy, attach, detach, ..."}, {name: "id", sig: "s", doc: "Instance UUID it was about."}, {name: "message", sig: "s", doc: "The error's message."}}},
			{name: "GPULost", doc: "A GPU fell off the bus or failed (an XID); its instances are marked lost or failed and carving there stops.", args: []arg{
				{name: "gpu", sig: "s", doc: "PCI address."}, {name: "gpu_uuid", sig: "s", doc: "GPU UUID."}, {name: "reason", sig: "s", doc: "What happened."}}},
			{name: "VMEvent", doc: "A libvirt domain event vgpud acted on.", args: []arg{
				{name: "vm_uuid", sig: "s", doc: "Domain UUID."}, {name: "vm", sig: "s", doc: "Domain name."}, {name: "event", sig: "s", doc: "defined, undefined, started, stopped, device-removed, device-removal-failed or reconnected."}}},
			{name: "PolicySwitched", doc: "A GPU's vGPU scheduler policy changed, or a change is pending: by the share loop or an operator's SetGPUScheduler.", args: []arg{
				{name: "gpu", sig: "s", doc: "GPU UUID."}, {name: "detail", sig: "s", doc: "Which policy and why."}}},
			{name: "PlacementBehind", doc: "An operation succeeded but did not keep its Placement promise (allocation written before carving, removed and the GPU's inventory published before returning), because Placement did not answer in time: a scheduler reading Placement now may see the old room. The sync's next pass brings Placement up to date. Sent to the operation's caller alone (a unicast signal, which the bus policy lets every caller receive), before the operation's reply.", args: []arg{
				{name: "operation", sig: "s", doc: "create or destroy."}, {name: "id", sig: "s", doc: "Instance UUID."}, {name: "detail", sig: "s", doc: "What was left to the sync, and why."}}},
			{name: "HostDrift", doc: "The host changed without an event (found by the periodic discovery or a reconcile): an instance's devices vanished (it was re-created or marked lost), a device no record explains appeared, or (kind `settings`, id the GPU's UUID) a GPU's heterogeneous mode or pinned scheduler that the driver had forgotten was set again.", args: []arg{
				{name: "kind", sig: "s", doc: "missing, foreign or settings."}, {name: "id", sig: "s", doc: "The instance UUID (missing), the GPU's PCI address (foreign) or the GPU's UUID (settings)."}, {name: "detail", sig: "s", doc: "What was found and done."}}},
		},
	}

	gpu := &ifaceDef{
		name: GPUInterface,
		doc:  "One physical GPU, at /dev/vgpud1/gpu/pci_DDDD_BB_SS_F.",
		methods: []*methodDef{
			{name: "SetMIGMode", access: accessManage, fn: s.objSetMIGMode,
				doc: "As Manager.SetMIGMode for this GPU.",
				in:  []arg{{name: "enabled", doc: "MIG on or off."}, optsArg}},
			{name: "SetHeterogeneous", access: accessManage, fn: s.objSetHeterogeneous,
				doc: "As Manager.SetHeterogeneous for this GPU.",
				in:  []arg{{name: "enabled", doc: "Mixed sizes on or off."}, optsArg}},
			{name: "SetScheduler", access: accessManage, fn: s.objSetScheduler,
				doc: "As Manager.SetGPUScheduler for this GPU.",
				in: []arg{{name: "mode", doc: "pinned, adaptive, or empty (pinned when a policy is given).", max: maxID},
					{name: "policy", doc: "best_effort, equal_share or fixed_share; empty with adaptive.", max: maxID},
					{name: "timeslice_usec", doc: "Time slice in microseconds, 1000..30000 (both ends included); 0 for the driver's default. InvalidArgument outside that range, before anything changes."}, optsArg},
				out: []arg{{name: "mode", doc: "pinned or adaptive."}, {name: "pending", doc: "The setting waits for the GPU's VMs to stop."}, {name: "detail", doc: "Why it is pending."}}},
			{name: "Clear", access: accessManage, fn: s.objClear,
				doc: "As Manager.ClearGPU for this GPU.",
				in:  []arg{optsArg}},
		},
		props: defsOf(gpuProps),
	}

	inst := &ifaceDef{
		name: InstanceInterface,
		doc:  "One instance (MIG instance, vGPU or whole GPU) held by a tenant, at /dev/vgpud1/instance/<uuid with _ for ->.",
		methods: []*methodDef{
			{name: "Destroy", access: accessManage, fn: s.objDestroy,
				doc: "As Manager.DestroyInstance for this instance. Options: detach (b).",
				in:  []arg{optsArg}},
			{name: "Attach", access: accessManage, fn: s.objAttach,
				doc: "As Manager.Attach for this instance. Options: display (b), ramfb (b), tenant (s).",
				in:  []arg{vmArg, optsArg},
				out: []arg{{name: "vm_uuid", doc: "UUID of the domain."}, {name: "live", doc: "Whether the device is also in the running domain."}}},
			{name: "Detach", access: accessManage, fn: s.objDetach,
				doc: "As Manager.Detach for this instance.",
				in:  []arg{optsArg}},
			{name: "GetHostdevXML", access: accessRead, fn: s.objHostdevXML,
				doc: "As Manager.GetHostdevXML for this instance.",
				out: []arg{{name: "xml", doc: "The <hostdev> element."}}},
		},
		props: defsOf(instanceProps),
	}

	ten := &ifaceDef{
		name: TenantInterface,
		doc:  "One tenant, at /dev/vgpud1/tenant/<name with _ for ->.",
		methods: []*methodDef{
			{name: "SetQuota", access: accessManage, fn: s.objSetQuota,
				doc: "As Manager.SetQuota for this tenant (options included).",
				in:  []arg{{name: "vram_bytes", doc: "VRAM quota in bytes; UINT64_MAX is unlimited."}, {name: "compute_milli", doc: "Compute quota in milli-GPU; UINT64_MAX is unlimited."}, {name: "max_instances", doc: "Instance count quota; UINT64_MAX is unlimited."}, optsArg}},
			{name: "Undefine", access: accessManage, fn: s.objUndefine,
				doc: "As Manager.UndefineTenant for this tenant.",
				in:  []arg{{name: "force", doc: "Destroy its instances first."}, optsArg}},
		},
		props: defsOf(tenantProps),
	}

	all := []*ifaceDef{mgr, gpu, inst, ten}
	all = append(all, s.standardInterfaces()...)
	out := map[string]*ifaceDef{}
	for _, d := range all {
		for _, m := range d.methods {
			if m.fn != nil {
				m.bind(d.name)
			}
		}
		out[d.name] = d
	}
	return out
}
