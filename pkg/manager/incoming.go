package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
	"github.com/vgpud/vgpud/pkg/virt"
)

// The destination's half of moving a VM with its vGPU (migrate.go has the
// whole).

// Incoming is an instance carved for a VM moving in.
type Incoming struct {
	Instance store.Instance
	// Device is what the VM's hostdev names on this host: the mdev's UUID
	// (the instance's, as on the source), or the VF's PCI address, which
	// the VM's definition on this host must name instead of the source's.
	Device string
	// Compatibility is the driver's answer for the GPU the instance is on.
	Compatibility gpu.Compatibility
}

// incomingPayload is an incoming intent's plan.
type incomingPayload struct {
	VM            string            `json:"vm"`
	DomainUUID    string            `json:"domainUUID,omitempty"`
	Compatibility gpu.Compatibility `json:"compatibility"`
	// Defined: DefineIncomingDomain defined the shut-off VM here, which
	// UndefineIncomingDomain undefines again (the VM stays on the source).
	Defined bool `json:"defined,omitempty"`
}

// hostDevice is the identity the VM's hostdev names for rec.
func hostDevice(rec store.Instance) string {
	if rec.Flow == store.FlowMdev {
		return rec.MdevUUID
	}
	return rec.VF
}

// checkMetadata refuses metadata this vgpud cannot act on.
func checkMetadata(md MigrationMetadata) error {
	switch {
	case md.Version != MigrationMetadataVersion:
		return fail(ErrInvalidArgument, nil, "migration metadata of version %d; this vgpud reads version %d", md.Version, MigrationMetadataVersion)
	case md.Kind != store.KindVGPU && md.Kind != store.KindMIGVGPU:
		return fail(ErrInvalidArgument, nil, "migration metadata of a %q instance; only vGPUs move with their VM", md.Kind)
	case len(md.VGPU) == 0 && !md.Cold:
		return fail(ErrInvalidArgument, nil, "migration metadata without the driver's vGPU metadata")
	}
	_, err := instanceUUID(md.Instance)
	return err
}

// PrepareIncoming carves, for VM vm (its libvirt name here; "": the
// source's domain name) of tenant tn ("": the source's tenant), an instance of the
// profile the metadata name, with the source instance's UUID, on a GPU the
// driver says takes the vGPU live (nvmlGetVgpuCompatibility, asked before
// anything is carved). Refusals: ErrConflict wrapping ErrIncompatibleGPU,
// ErrOtherMIGLayout, ErrIncompatibleDriver or ErrLiveUnsupported;
// ErrNoCapacity; ErrQuotaExceeded; nothing is carved. The instance is
// held for the VM (Busy to other operations) until CommitIncoming or
// AbortIncoming. A second call for the same instance and VM answers again.
func (m *Manager) PrepareIncoming(ctx context.Context, md MigrationMetadata, vm, tn string) (Incoming, error) {
	if err := checkMetadata(md); err != nil {
		return Incoming{}, err
	}
	if vm == "" {
		// libvirt's migration keeps the domain's name, by which libvirt
		// finds it.
		vm = md.Domain
	}
	if tn == "" {
		tn = md.Tenant
	}
	if err := checkVMRef(vm); err != nil {
		return Incoming{}, err
	}
	if err := tenant.ValidateName(tn); err != nil {
		return Incoming{}, classify(err, "tenant")
	}
	done, err := m.begin()
	if err != nil {
		return Incoming{}, err
	}
	defer done()
	if m.migr == nil {
		return Incoming{}, fail(ErrBackendFailure, nil, "this host's NVML cannot check vGPU migration compatibility")
	}
	if err := m.knownTenant(tn); err != nil {
		return Incoming{}, err
	}
	u, _ := instanceUUID(md.Instance) // checked by checkMetadata
	if in, ok, err := m.incomingAgain(u, vm, tn, md.Profile); ok || err != nil {
		return in, err
	}
	if err := m.sameProfile(md); err != nil {
		return Incoming{}, err
	}
	gpus, err := m.compatibleGPUs(ctx, md)
	if err != nil {
		return Incoming{}, err
	}
	intent := uuid.NewString()
	payload, _ := json.Marshal(incomingPayload{VM: vm, DomainUUID: md.DomainUUID, Compatibility: gpus[0].c}) // cannot fail
	if err := m.db.Update(func(tx *store.Tx) error {
		if _, err := tx.Instance(u); err == nil {
			return fail(ErrConflict, nil, "instance %s exists on this host; release it before a VM moves in with it", u)
		}
		if err := busy(tx, u); err != nil {
			return err
		}
		return tx.PutIntent(store.Intent{ID: intent, Op: store.OpIncoming, Instance: u, Payload: payload, Started: m.now()})
	}); err != nil {
		return Incoming{}, classify(err, "record the incoming migration of instance %s", u)
	}
	m.holdMigration(intent, u)
	m.crash(CrashIncomingIntent)
	var rec store.Instance
	var c gpu.Compatibility
	err = nil
	for _, g := range gpus {
		rec, err = m.Create(ctx, CreateRequest{UUID: u, Tenant: tn, Profile: md.Profile, GPU: g.gpu.UUID})
		c = g.c
		if err == nil || !errors.Is(err, ErrNoCapacity) {
			break
		}
	}
	if err != nil {
		if derr := m.dropIntent(intent); derr != nil {
			// Reconcile drops it: it names no instance.
			m.log.Error("drop the intent of a refused incoming migration", "instance", u, "err", derr)
		}
		m.releaseMigration(intent)
		if errors.Is(err, ErrNoCapacity) {
			return Incoming{}, fail(ErrNoCapacity, err, "no room for %s on the GPUs that take the vGPU of VM %s", md.Profile, vm)
		}
		return Incoming{}, err
	}
	if c != gpus[0].c {
		payload, _ = json.Marshal(incomingPayload{VM: vm, DomainUUID: md.DomainUUID, Compatibility: c}) // cannot fail
		if err := m.db.Update(func(tx *store.Tx) error {
			it, err := tx.Intent(intent)
			if err != nil {
				return err
			}
			it.Payload = payload
			return tx.PutIntent(it)
		}); err != nil {
			m.log.Warn("record the compatibility of an incoming instance", "instance", u, "err", err)
		}
	}
	m.crash(CrashIncomingCarve)
	m.log.Info("migration: instance carved for a VM moving in", "instance", u, "vm", vm, "gpu", rec.GPUPCI, "device", hostDevice(rec))
	return Incoming{Instance: rec, Device: hostDevice(rec), Compatibility: c}, nil
}

// incomingAgain answers a second PrepareIncoming of instance u: ok when
// one for VM vm, tenant tn and profile is under way and its instance
// carved; the same instance asked for anything else is a Conflict, never
// the first answer.
func (m *Manager) incomingAgain(u, vm, tn, profile string) (Incoming, bool, error) {
	it, rec, missing, err := m.migrationOf(store.OpIncoming, u)
	if err != nil || it == nil {
		return Incoming{}, false, err
	}
	var p incomingPayload
	_ = json.Unmarshal(it.Payload, &p) // written by PrepareIncoming
	if p.VM != vm {
		return Incoming{}, false, fail(ErrConflict, nil, "instance %s is being prepared for VM %s", u, p.VM)
	}
	if missing || rec.State != store.StateReady {
		return Incoming{}, false, fail(ErrBusy, nil, "instance %s is still being prepared; retry shortly", u)
	}
	if rec.Tenant != tn || rec.Profile != profile {
		return Incoming{}, false, fail(ErrConflict, nil, "instance %s is being prepared as %s of tenant %s, not %s of tenant %s", u, rec.Profile, rec.Tenant, profile, tn)
	}
	m.holdMigration(it.ID, u)
	return Incoming{Instance: rec, Device: hostDevice(rec), Compatibility: p.Compatibility}, true, nil
}

// sameProfile checks that this host's catalog has the source's profile on
// the source's GPU model, and for a MIG-backed vGPU with the source's
// GPU-instance profile (NVIDIA: identical MIG configuration).
func (m *Manager) sameProfile(md MigrationMetadata) error {
	offers, err := m.offersFor(md.Profile)
	if err != nil {
		return err
	}
	for _, o := range offers {
		if o.model.Name != md.Model {
			continue
		}
		if o.kind != md.Kind {
			return refuseIncoming(ErrOtherMIGLayout, "profile %s is a %s here and a %s on the source", md.Profile, o.kind, md.Kind)
		}
		if md.Kind == store.KindMIGVGPU && (o.gi == nil || o.gi.ID != md.GIProfileID || o.gi.Size != md.GISize) {
			return refuseIncoming(ErrOtherMIGLayout, "profile %s is GPU-instance profile %d of %d slices on the source and another here", md.Profile, md.GIProfileID, md.GISize)
		}
		return nil
	}
	return refuseIncoming(ErrIncompatibleGPU, "profile %s is not offered on %s here (the source's GPU type)", md.Profile, md.Model)
}

// refuseIncoming is PrepareIncoming's Conflict for reason (ErrIncompatibleGPU,
// ErrOtherMIGLayout, ErrIncompatibleDriver, ErrLiveUnsupported), its
// message opening with the reason: over D-Bus only the name (Conflict) and
// the message travel, so a caller tells the reasons apart by the message.
func refuseIncoming(reason error, format string, args ...any) error {
	return &opError{kind: ErrConflict, msg: reason.Error() + ": " + fmt.Sprintf(format, args...), cause: reason, shown: true}
}

// candidate is a GPU the driver says takes the vGPU, with its answer.
type candidate struct {
	gpu gpu.GPU
	c   gpu.Compatibility
}

// compatibleGPUs asks the driver which of this host's GPUs of the source's
// model take the vGPU live, and names why none does.
func (m *Manager) compatibleGPUs(ctx context.Context, md MigrationMetadata) ([]candidate, error) {
	var out []candidate
	model, mode := 0, 0
	var why error
	for _, g := range m.Inventory().GPUs {
		if g.Model != md.Model || g.Lost || m.gpuFault(g.UUID) != "" {
			continue
		}
		model++
		if g.MIG.Enabled != (md.Kind == store.KindMIGVGPU) {
			continue
		}
		mode++
		pg, err := m.migr.PGPUMetadata(ctx, g.UUID)
		if errors.Is(err, gpu.ErrNotSupported) {
			continue // no vGPU host
		}
		if err != nil {
			return nil, classify(err, "read the vGPU metadata of GPU %s", g.PCI)
		}
		if md.Cold {
			// No vGPU runs: the driver has nothing to compare, and a VM
			// started here gets a vGPU of the same type.
			out = append(out, candidate{g, gpu.Compatibility{VM: gpu.CompatCold}})
			continue
		}
		c, err := m.migr.VGPUCompatibility(ctx, md.VGPU, pg)
		if errors.Is(err, gpu.ErrInvalid) {
			return nil, fail(ErrInvalidArgument, err, "the driver does not read the vGPU metadata of instance %s", md.Instance)
		}
		if err != nil {
			return nil, classify(err, "ask the driver whether GPU %s takes the vGPU", g.PCI)
		}
		switch {
		case c.VM&gpu.CompatLive != 0:
			out = append(out, candidate{g, c})
		case c.VM != gpu.CompatNone:
			why = refuseIncoming(ErrLiveUnsupported, "the driver moves the vGPU to GPU %s only with the VM stopped (%s; limit: %s)", g.PCI, c.VM, c.Limit)
		case c.Limit&(gpu.LimitHostDriver|gpu.LimitGuestDriver) != 0 && why == nil:
			why = refuseIncoming(ErrIncompatibleDriver, "the driver of GPU %s does not take the vGPU (limit: %s): the hosts' or the guest's drivers differ", g.PCI, c.Limit)
		case why == nil:
			why = refuseIncoming(ErrIncompatibleGPU, "the driver does not move the vGPU to GPU %s (limit: %s): the GPUs differ (ECC, MIG)", g.PCI, c.Limit)
		}
	}
	switch {
	case len(out) > 0:
		return out, nil
	case model == 0:
		return nil, refuseIncoming(ErrIncompatibleGPU, "no GPU of type %s on this host in service", md.Model)
	case mode == 0 && md.Kind == store.KindMIGVGPU:
		return nil, refuseIncoming(ErrOtherMIGLayout, "no GPU of type %s here is in MIG mode, which the MIG-backed vGPU %s needs", md.Model, md.Profile)
	case mode == 0:
		return nil, refuseIncoming(ErrOtherMIGLayout, "every GPU of type %s here is in MIG mode; the time-sliced vGPU %s needs one with MIG off", md.Model, md.Profile)
	case why == nil:
		return nil, refuseIncoming(ErrIncompatibleGPU, "no GPU of type %s here hosts vGPUs", md.Model)
	}
	return nil, why
}

// gpuFault says why a GPU is out of service ("" when it is in service).
func (m *Manager) gpuFault(uuid string) string {
	m.invMu.RLock()
	defer m.invMu.RUnlock()
	return m.failedGPUs[uuid].Why
}

// CommitIncoming records that the VM the instance was prepared for holds
// it: the VM's definition here (libvirt) must name the instance's device.
// Done once, it answers the attachment again.
func (m *Manager) CommitIncoming(ctx context.Context, id string) (store.Attachment, error) {
	u, err := instanceUUID(id)
	if err != nil {
		return store.Attachment{}, err
	}
	end, err := m.migrationCall()
	if err != nil {
		return store.Attachment{}, err
	}
	defer end()
	it, rec, missing, err := m.migrationOf(store.OpIncoming, u)
	if err != nil {
		return store.Attachment{}, err
	}
	if it == nil {
		var a store.Attachment
		err := m.db.View(func(tx *store.Tx) (err error) { a, err = tx.Attachment(u); return err })
		if err == nil && !missing {
			return a, nil
		}
		return store.Attachment{}, fail(ErrNotFound, err, "no VM is moving in with instance %s (PrepareIncoming first)", u)
	}
	if missing || rec.State != store.StateReady {
		return store.Attachment{}, fail(ErrBusy, nil, "instance %s is still being prepared; retry shortly", u)
	}
	v := m.lv()
	if v == nil {
		return store.Attachment{}, fail(ErrBackendFailure, nil, "libvirt is not configured for this daemon")
	}
	var p incomingPayload
	_ = json.Unmarshal(it.Payload, &p) // written by PrepareIncoming
	a, holds, err := m.arrived(ctx, v, rec, p)
	if errors.Is(err, virt.ErrDomainNotFound) {
		return store.Attachment{}, classifyVirt(err, "VM %s has not arrived: the migration did not finish here (AbortIncoming releases the instance)", p.VM)
	}
	if err != nil {
		return store.Attachment{}, classifyVirt(err, "ask libvirt about VM %s", p.VM)
	}
	if !holds {
		return store.Attachment{}, fail(ErrConflict, nil, "VM %s on this host does not hold %s, the device of instance %s: its definition here must name it", p.VM, hostDevice(rec), u)
	}
	m.crash(CrashIncomingCommit)
	if err := m.db.Update(func(tx *store.Tx) error {
		if _, err := tx.Intent(it.ID); errors.Is(err, store.ErrNotFound) {
			return errMigrationEnded
		} else if err != nil {
			return err
		}
		if err := tx.PutAttachment(a); err != nil {
			return err
		}
		return tx.DeleteIntent(it.ID)
	}); errors.Is(err, errMigrationEnded) {
		return store.Attachment{}, fail(ErrConflict, nil, "the incoming migration of instance %s was ended meanwhile (a reconcile resolved it by where libvirt has the VM): check with vgpuctl list", u)
	} else if err != nil {
		return store.Attachment{}, classify(err, "record the attachment of instance %s", u)
	}
	m.releaseMigration(it.ID)
	m.log.Info("migration: VM arrived", "instance", u, "vm", a.Domain)
	m.emit(Event{Kind: EventInstanceChanged, ID: u, Op: "migrate-in", Detail: fmt.Sprintf("VM %s arrived", a.Domain)})
	return a, nil
}

// arrived says whether the VM of an incoming migration is here holding
// rec's device, with the attachment to record if so.
func (m *Manager) arrived(ctx context.Context, v Virt, rec store.Instance, p incomingPayload) (store.Attachment, bool, error) {
	h, err := m.hostdevOf(rec, false, false)
	if err != nil {
		return store.Attachment{}, false, err
	}
	held, err := v.Attached(ctx, p.VM)
	if err != nil {
		return store.Attachment{}, false, err
	}
	for _, x := range held {
		// The persistent definition decides: while libvirt migrates, the
		// domain exists here transient and paused with the device live,
		// and may still fail back to the source.
		if x.Config && sameDevice(x.Hostdev, h) {
			dom, err := v.Domain(ctx, p.VM)
			if err != nil {
				return store.Attachment{}, false, err
			}
			if p.DomainUUID != "" && !strings.EqualFold(dom.UUID, p.DomainUUID) {
				return store.Attachment{}, false, nil // another domain of the VM's name
			}
			return store.Attachment{Instance: rec.UUID, Domain: dom.Name, DomainUUID: dom.UUID, URI: v.URI(), Live: x.Live, Created: m.now()}, true, nil
		}
	}
	return store.Attachment{}, false, nil
}

// AbortIncoming releases the instance carved for a VM that did not come
// (libvirt's migration failed). It is refused once the VM holds it here
// (CommitIncoming's, or libvirt runs the VM with it). Done once, or for an
// instance that is gone, it answers success.
func (m *Manager) AbortIncoming(ctx context.Context, id string) error {
	u, err := instanceUUID(id)
	if err != nil {
		return err
	}
	end, err := m.migrationCall()
	if err != nil {
		return err
	}
	defer end()
	it, rec, missing, err := m.migrationOf(store.OpIncoming, u)
	if err != nil || (it == nil && missing) {
		return err
	}
	if it == nil && rec.State == store.StateDestroying {
		return nil // released; a release the driver failed, reconcile finishes
	}
	if it == nil {
		return fail(ErrConflict, nil, "instance %s is its VM's: the VM moved in (destroy it to release it)", u)
	}
	if v := m.lv(); v != nil && !missing && rec.State == store.StateReady {
		var p incomingPayload
		_ = json.Unmarshal(it.Payload, &p) // written by PrepareIncoming
		// Released only when libvirt says the VM is not here with the
		// device: a libvirt that does not answer releases nothing, and a
		// VM defined here naming it (running or not) holds it.
		_, holds, err := m.arrived(ctx, v, rec, p)
		switch {
		case errors.Is(err, virt.ErrDomainNotFound):
		case err != nil:
			return classifyVirt(err, "ask libvirt whether VM %s came", p.VM)
		case holds:
			return fail(ErrBusy, nil, "VM %s is defined on this host with instance %s: the migration finished here (CommitIncoming)", p.VM, u)
		}
	}
	if err := m.releaseMigrated(ctx, *it, rec, missing, "incoming", false); err != nil {
		return err
	}
	m.releaseMigration(it.ID)
	m.log.Info("migration: VM did not come; instance released", "instance", u)
	return nil
}
