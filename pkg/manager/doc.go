// Package manager holds vgpud's operations: create and destroy instances
// for tenants, attach and detach them to VMs, tenant quotas, planning,
// defragmentation and reconcile. Each operation writes an intent before it
// touches the host, records every finished step, and commits or undoes
// them in reverse on failure; a crash half-way is finished or undone by
// reconcile at the next start. Admission (quota and capacity) is decided
// under one lock, with the decision recorded before the lock is released,
// so concurrent requests cannot over-commit a quota or a slot.
//
// The manager declares what it needs from the GPU backends, discovery,
// libvirt and the store as small interfaces; transports (D-Bus) forward to
// it and map its sentinel errors (errors.go) to their own names.
//
// # Words
//
// An operation (create, destroy, attach, detach, move, create-and-attach)
// writes an intent, the record of what it is doing, before it touches the
// host. A crash leaves the intent behind; reconcile resolves it (finishes or
// undoes the operation). Reconcile then restores every record whose
// devices the host no longer holds (re-creates them); recovery is that
// restore of all GPUs side by side. A host quiesces when every call that
// outran its deadline has returned. After an operation the fleet (OpenStack
// Placement) is settled: told what changed; claims are Placement's too.
// docs/architecture.md, "Words", has the whole glossary.
//
// # Files
//
// Operations, what callers ask for:
//
//   - manager.go: the Manager, its ports' wiring, its locks and their
//     order, host reads (Refresh) and sysfs calls bounded by a deadline
//   - create.go, decide.go, carve.go: a create's admission, the decision
//     where it goes, and its host steps; basis.go: what a decision was
//     made from, so that a create that claimed decides once; compute.go:
//     compute instances in a shared GPU instance; offers.go: profile
//     names and what each costs
//   - destroy.go, release.go: a destroy, and taking an instance off the
//     host in reverse (also an undo's)
//   - attach.go: attach and detach, and their unclear libvirt answers;
//     createattach.go: create-and-attach under one intent
//   - defrag.go: Defragment's moves; plan.go: Plan and Capacity
//   - gpus.go: GPU operations (MIG mode, heterogeneous mode, failed and
//     lost GPUs, clear); sched.go: vGPU scheduler pins; sched_gi.go: the
//     pins of GPU instances' schedulers (Blackwell GB20x), set again when
//     a GPU instance is re-created or the driver reloads;
//     sched_gi_gone.go: those pins dropped with their GPU instance (its
//     destroy, MIG off) or, once it is gone, by its last id; migreset.go:
//     a MIG mode change carried through a GPU reset (the VFs and vgpud's
//     NVML session let go around it), finished at restart
//   - migrate.go: moving a VM with its vGPU to another host, the
//     source's half (MigrationSource, CompleteOutgoing, CancelOutgoing)
//     and the hold of a migration's intents between its calls;
//     incoming.go: the destination's half (PrepareIncoming, checked with
//     the driver before anything is carved; CommitIncoming,
//     AbortIncoming); migrate_domain.go: a shut-off VM's definition
//     moved by the two vgpuds, each on its own libvirt
//     (OutgoingDomainXML, DefineIncomingDomain, UndefineOutgoingDomain);
//     migrate_live.go: a running VM moved by libvirt's live migration,
//     its versions checked before anything is carved (MigrationTarget,
//     PrecheckOutgoingLive, MigrateOutgoingLive)
//   - tenants.go: tenants and quotas; args.go: argument checks and names
//   - drain.go: Shutdown waits for operations in flight
//   - fleet.go: the claim hooks of a create; behind.go: what an
//     operation left Placement behind on, for its caller
//   - migrate_fleet.go: a moving VM's Placement allocation, moved to a
//     migration consumer on the source and back
//
// Recovery, after a crash, a reboot or a change behind vgpud's back:
//
//   - reconcile.go: the pass (intents, then the host, then libvirt)
//   - migrate_resolve.go: a migration's intents a crash left, resolved
//     by where libvirt has the VM
//   - intents.go: resolving each intent a crash left; inflight.go: the
//     intents this process is working on, which reconcile leaves alone
//   - recovery.go: restoring all GPUs side by side; restore.go: one
//     record's devices back on the host
//   - domains.go: the libvirt pass (attachments of VMs that are gone,
//     moved devices, live flags); virtevents.go: libvirt's domain events
//   - drift.go: the periodic comparison of records with the host;
//     settings.go: the GPU settings the driver forgets (heterogeneous
//     mode, a pinned scheduler) found lost there and set again
//   - ownership.go: which devices are vgpud's; present.go: which of a
//     record's parts the host holds; foreign.go: devices no record explains
//   - crash.go: crash points at every step boundary
//
// Views, what callers read:
//
//   - view.go: the snapshot an admission decides on, a GPU's state,
//     instance views
//   - room.go: how many more of each profile one GPU takes (roomOn), the
//     one number Capacity adds up and the fleet view publishes
//   - fleetview.go: the host's facts for Placement, whole or one GPU
//     (state, modes, records, room per class); pkg/fleet counts them
//   - events.go: events to subscribers; refusal.go: why a request does
//     not fit, in words; errors.go: the sentinels and their translation
//
// Ports, what the manager needs from others, declared here as interfaces:
// MIGBackend, VGPUBackend, NVMLBackend, SysfsBackend and Discoverer
// (manager.go), Virt (attach.go), SchedulerBackend (sched.go),
// GPUInstanceSchedulerBackend (sched_gi.go), Fleet (fleet.go).
//
// Imports: internal/hostcall, pkg/discover, pkg/gpu, pkg/placement, pkg/profile, pkg/store, pkg/tenant, pkg/virt.
package manager
