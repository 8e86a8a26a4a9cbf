package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/virt"
)

// Moving a VM with its vGPU to another vgpud host (docs/operations.md,
// "Moving VMs"). The source names what the VM's vGPU is
// (MigrationSource: the instance's profile, flow, tenant, MIG placement and
// the driver's metadata of the running vGPU); the destination checks with
// the driver that one of its GPUs can take it and carves an instance of the
// same profile for the VM (PrepareIncoming); libvirt moves the VM; then the
// destination records the VM's attachment (CommitIncoming) and the source
// releases its instance (CompleteOutgoing), or, when libvirt failed, the
// destination releases what it carved (AbortIncoming) and the source keeps
// its instance (CancelOutgoing). Each side's part is an intent
// (store.OpOutgoing, store.OpIncoming) from its first call to its last;
// a restart, or a reconcile after MigrationHold, resolves the intent by
// where libvirt has the VM (resolveOutgoing, resolveIncoming).

// MigrationBackend is what the manager needs from NVML to move a vGPU
// (pkg/gpu/nvml's Backend, over the driver or the simulator).
type MigrationBackend interface {
	VGPUMetadata(ctx context.Context, gpuUUID string, ref gpu.VGPURef) (gpu.VGPUMetadata, error)
	PGPUMetadata(ctx context.Context, gpuUUID string) (gpu.PGPUMetadata, error)
	VGPUCompatibility(ctx context.Context, vm gpu.VGPUMetadata, pgpu gpu.PGPUMetadata) (gpu.Compatibility, error)
}

// DefaultMigrationHold is how long a migration's intents belong to the
// calls that move the VM before reconcile may resolve them (Config.MigrationHold).
const DefaultMigrationHold = 30 * time.Minute

// MigrationMetadataVersion is the version of MigrationMetadata this vgpud
// writes and reads.
const MigrationMetadataVersion = 1

// MigrationMetadata is what the source tells the destination about the
// moving VM's vGPU. It travels between the hosts as JSON.
type MigrationMetadata struct {
	Version int `json:"version"`
	// Instance is the source instance's UUID; the destination's instance
	// takes it, so the VM's vgpud metadata and an mdev's UUID (the
	// instance's) stay true on the destination.
	Instance string             `json:"instance"`
	Tenant   string             `json:"tenant"`
	Profile  string             `json:"profile"`
	Model    string             `json:"model"`
	Kind     store.InstanceKind `json:"kind"`
	Flow     store.Flow         `json:"flow"`
	TypeID   int                `json:"typeID"`
	TypeName string             `json:"typeName"`
	// GIProfileID, GIStart and GISize place a MIG-backed vGPU's GPU
	// instance; GIProfileID is -1 for a time-sliced vGPU.
	GIProfileID int    `json:"giProfileID"`
	GIStart     int    `json:"giStart"`
	GISize      int    `json:"giSize"`
	Domain      string `json:"domain"`
	DomainUUID  string `json:"domainUUID"`
	// VGPU is the driver's metadata of the running vGPU, which the
	// destination's driver reads (nvmlGetVgpuCompatibility); none when
	// Cold.
	VGPU gpu.VGPUMetadata `json:"vgpu"`
	// Cold says the VM is shut off: no vGPU runs, so the driver has no
	// metadata of it, and the VM moves as its persistent definition.
	Cold bool `json:"cold,omitempty"`
}

// Why a destination refuses a VM, each wrapped with ErrConflict (no room
// is ErrNoCapacity, a tenant over its quota ErrQuotaExceeded).
var (
	// ErrIncompatibleGPU: no GPU here is of the source's type, or the
	// driver says the GPU differs (ECC, MIG mode).
	ErrIncompatibleGPU = errors.New("no GPU of a compatible type")
	// ErrOtherMIGLayout: a MIG-backed vGPU needs a GPU instance of the
	// source's profile on a GPU in MIG mode.
	ErrOtherMIGLayout = errors.New("another MIG layout")
	// ErrIncompatibleDriver: the host or guest driver is not one the
	// destination's driver takes a vGPU from.
	ErrIncompatibleDriver = errors.New("incompatible driver")
	// ErrLiveUnsupported: the driver moves the vGPU only with its VM
	// stopped.
	ErrLiveUnsupported = errors.New("live migration not supported")
)

// migrationHolds keeps a migration's intent in the inflight set between
// the calls that move the VM, up to the hold (so that a reconcile does
// not resolve a migration under way), and lets go at its last call.
type migrationHolds struct {
	mu sync.Mutex
	m  map[string]func()
}

// holdMigration puts a migration's intent in the inflight set for the
// hold, unless it is held already (a repeated call; after a restart whose
// reconcile could not resolve it, the repeated call holds it again).
func (m *Manager) holdMigration(intent, instance string) {
	// The inflight set's mutex and this one are leaves: neither is taken
	// under the other.
	letGo := m.inflight.add(intent, instance)
	m.migHolds.mu.Lock()
	_, held := m.migHolds.m[intent]
	if !held {
		if m.migHolds.m == nil {
			m.migHolds.m = map[string]func(){}
		}
		t := time.AfterFunc(m.migHold, func() { m.releaseMigration(intent) })
		m.migHolds.m[intent] = func() { t.Stop(); letGo() }
	}
	m.migHolds.mu.Unlock()
	if held {
		letGo()
	}
}

// releaseMigration lets go of a migration's intent.
func (m *Manager) releaseMigration(intent string) {
	m.migHolds.mu.Lock()
	f := m.migHolds.m[intent]
	delete(m.migHolds.m, intent)
	m.migHolds.mu.Unlock()
	if f != nil {
		f()
	}
}

// migrationIntent finds the intent of op naming instance.
func migrationIntent(tx *store.Tx, op store.Op, instance string) (*store.Intent, error) {
	its, err := tx.Intents()
	if err != nil {
		return nil, err
	}
	for i := range its {
		if its[i].Op == op && its[i].Instance == instance {
			return &its[i], nil
		}
	}
	return nil, nil
}

// outgoingPayload is an outgoing intent's plan.
type outgoingPayload struct {
	Domain     string `json:"domain"`
	DomainUUID string `json:"domainUUID"`
	// Consumer is the migration's Placement consumer, which holds the
	// instance's allocation while the VM moves (migrate_fleet.go).
	Consumer string `json:"consumer,omitempty"`
}

// here says whether libvirt has the moving VM on this host, and whether it
// runs. libvirt finds domains by name; a domain of that name with another
// UUID is another VM, and the moving one is gone.
func (p outgoingPayload) here(ctx context.Context, v Virt) (here, running bool, err error) {
	dom, err := v.Domain(ctx, p.Domain)
	if errors.Is(err, virt.ErrDomainNotFound) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	if p.DomainUUID != "" && !strings.EqualFold(dom.UUID, p.DomainUUID) {
		return false, false, nil
	}
	return true, dom.Running, nil
}

// MigrationSource starts moving the VM of instance id to another host: it
// reads the driver's metadata of the running vGPU and records the
// outgoing migration (the instance is Busy for other operations until
// CompleteOutgoing or CancelOutgoing). Only an attached vGPU moves; when
// libvirt has its VM shut off the metadata say Cold and carry no driver
// metadata (no vGPU runs). A second call while the migration is under
// way answers again.
func (m *Manager) MigrationSource(ctx context.Context, id string) (MigrationMetadata, error) {
	done, err := m.begin()
	if err != nil {
		return MigrationMetadata{}, err
	}
	defer done()
	if m.migr == nil {
		return MigrationMetadata{}, fail(ErrBackendFailure, nil, "this host's NVML cannot read vGPU migration metadata")
	}
	rec, att, err := m.instanceAndAttachment(id)
	if err != nil {
		return MigrationMetadata{}, err
	}
	if rec.Kind == store.KindMIG {
		// Said as attach says it: "a mig instance" reads as a MIG-backed
		// vGPU, which does move.
		return MigrationMetadata{}, fail(ErrInvalidArgument, nil, "instance %s is a plain MIG instance (compute only): it is attached to no VM and cannot be, so it does not move with one; only vGPUs (vgpu, mig-vgpu) move with their VM", rec.UUID)
	}
	if rec.Kind != store.KindVGPU && rec.Kind != store.KindMIGVGPU {
		return MigrationMetadata{}, fail(ErrInvalidArgument, nil, "instance %s is a %s instance; only vGPUs move with their VM", rec.UUID, rec.Kind)
	}
	if att == nil {
		return MigrationMetadata{}, fail(ErrInvalidArgument, nil, "instance %s is attached to no VM; there is no VM to move", rec.UUID)
	}
	if rec.State != store.StateReady {
		return MigrationMetadata{}, fail(ErrBusy, nil, "instance %s is %s; only a ready instance moves", rec.UUID, rec.State)
	}
	ref := gpu.VGPURef{MdevUUID: rec.MdevUUID, VMID: att.DomainUUID, Type: rec.TypeID, GPUInstance: -1}
	if rec.Flow != store.FlowMdev {
		ref.MdevUUID = ""
		if rec.Kind == store.KindMIGVGPU {
			ref.GPUInstance = rec.GIID
		}
	}
	cold, err := m.shutOff(ctx, att)
	if err != nil {
		return MigrationMetadata{}, err
	}
	var blob gpu.VGPUMetadata
	if !cold {
		blob, err = m.migr.VGPUMetadata(ctx, rec.GPUUUID, ref)
	}
	if errors.Is(err, gpu.ErrNotFound) {
		return MigrationMetadata{}, fail(ErrConflict, err, "the vGPU of instance %s is not running: start VM %s first (a live migration moves a running VM)", rec.UUID, att.Domain)
	}
	if err != nil {
		return MigrationMetadata{}, classify(err, "read the vGPU metadata of instance %s", rec.UUID)
	}
	md := MigrationMetadata{Version: MigrationMetadataVersion, Instance: rec.UUID, Tenant: rec.Tenant, Profile: rec.Profile, Model: rec.Model,
		Kind: rec.Kind, Flow: rec.Flow, TypeID: rec.TypeID, TypeName: rec.TypeName, GIProfileID: rec.GIProfileID, GIStart: rec.GIStart, GISize: rec.GISize,
		Domain: att.Domain, DomainUUID: att.DomainUUID, VGPU: blob, Cold: cold}
	if rec.Kind != store.KindMIGVGPU {
		md.GIProfileID, md.GIStart, md.GISize = -1, -1, 0
	}
	intent := uuid.NewString()
	consumer := migrationConsumer(rec.UUID, intent)
	payload, _ := json.Marshal(outgoingPayload{Domain: att.Domain, DomainUUID: att.DomainUUID, Consumer: consumer}) // strings: cannot fail
	again := false
	err = m.db.Update(func(tx *store.Tx) error {
		prior, err := migrationIntent(tx, store.OpOutgoing, rec.UUID)
		if err != nil || prior != nil {
			if again = prior != nil; again {
				intent = prior.ID
				var p outgoingPayload
				_ = json.Unmarshal(prior.Payload, &p) // written by the first call
				consumer = p.Consumer
			}
			return err
		}
		if a, err := tx.Attachment(rec.UUID); err != nil || a.DomainUUID != att.DomainUUID {
			return fail(ErrBusy, err, "instance %s was detached meanwhile", rec.UUID)
		}
		if err := busy(tx, rec.UUID); err != nil {
			return err
		}
		return beginOutgoing(tx, store.Intent{ID: intent, Op: store.OpOutgoing, Instance: rec.UUID, Payload: payload, Started: m.now()}, rec.UUID)
	})
	if err != nil {
		return MigrationMetadata{}, classify(err, "record the outgoing migration of instance %s", rec.UUID)
	}
	m.holdMigration(intent, rec.UUID)
	if !again {
		m.log.Info("migration: VM leaving", "instance", rec.UUID, "vm", att.Domain, "profile", rec.Profile)
		m.emit(Event{Kind: EventInstanceChanged, ID: rec.UUID, Op: "migrate-out", Detail: fmt.Sprintf("VM %s is moving to another host", att.Domain)})
		m.crash(CrashOutgoingIntent)
	}
	// The instance's UUID is the destination's to claim from now on (a
	// repeated call moves what a first one could not).
	m.moveOutgoing(ctx, rec.UUID, consumer)
	if !again {
		m.crash(CrashOutgoingMove)
	}
	return md, nil
}

// shutOff says whether libvirt has the attachment's VM defined here and
// shut off (it then moves cold, without the driver's metadata). Without
// libvirt the VM is taken to run, as the driver will say.
func (m *Manager) shutOff(ctx context.Context, att *store.Attachment) (bool, error) {
	v := m.lv()
	if v == nil {
		return false, nil
	}
	here, running, err := outgoingPayload{Domain: att.Domain, DomainUUID: att.DomainUUID}.here(ctx, v)
	if err != nil {
		return false, classifyVirt(err, "ask libvirt whether VM %s runs", att.Domain)
	}
	if !here {
		return false, fail(ErrNotFound, nil, "VM %s (%s) is not defined on this host", att.Domain, att.DomainUUID)
	}
	return !running, nil
}

// CompleteOutgoing releases the instance whose VM moved to another host,
// with its attachment record. It is refused while libvirt still runs the
// VM here (the migration has not finished). Done once, it answers success
// again: an instance that is gone has left.
func (m *Manager) CompleteOutgoing(ctx context.Context, id string) error {
	u, err := instanceUUID(id)
	if err != nil {
		return err
	}
	end, err := m.migrationCall()
	if err != nil {
		return err
	}
	defer end()
	it, rec, missing, err := m.migrationOf(store.OpOutgoing, u)
	if err != nil || (missing && it == nil) {
		return err // missing: released already
	}
	if it == nil && rec.State == store.StateDestroying {
		return nil // released; a release the driver failed, reconcile finishes
	}
	if it == nil {
		return fail(ErrConflict, nil, "instance %s is not moving to another host (no MigrationSource, or its VM stayed here)", u)
	}
	var p outgoingPayload
	_ = json.Unmarshal(it.Payload, &p) // written by MigrationSource; an empty plan asks libvirt nothing
	if v := m.lv(); v != nil && p.Domain != "" {
		here, running, err := p.here(ctx, v)
		if err != nil {
			return classifyVirt(err, "ask libvirt where VM %s is", p.Domain)
		}
		if here && running {
			return fail(ErrBusy, nil, "VM %s still runs on this host: the migration has not finished; complete it once libvirt moved the VM", p.Domain)
		}
	}
	err = m.releaseMigrated(ctx, *it, rec, missing, "outgoing", false)
	if err == nil {
		m.releaseMigration(it.ID)
		m.log.Info("migration: VM left; instance released", "instance", u, "vm", p.Domain)
	}
	return err
}

// CancelOutgoing ends an outgoing migration whose VM stayed here (libvirt's
// migration failed): the instance and its attachment are kept. Done once,
// or never begun, it answers success.
func (m *Manager) CancelOutgoing(ctx context.Context, id string) error {
	u, err := instanceUUID(id)
	if err != nil {
		return err
	}
	end, err := m.migrationCall()
	if err != nil {
		return err
	}
	defer end()
	it, _, _, err := m.migrationOf(store.OpOutgoing, u)
	if err != nil || it == nil {
		return err
	}
	var p outgoingPayload
	_ = json.Unmarshal(it.Payload, &p) // written by MigrationSource; an empty plan asks libvirt nothing
	if v := m.lv(); v != nil && p.Domain != "" {
		// Kept only while the VM is here: a cancel after libvirt moved it
		// would leave its attachment on both hosts.
		here, _, err := p.here(ctx, v)
		if err != nil {
			return classifyVirt(err, "ask libvirt where VM %s is", p.Domain)
		}
		if !here {
			return fail(ErrConflict, nil, "VM %s is no longer on this host: the migration finished (CompleteOutgoing releases instance %s)", p.Domain, u)
		}
	}
	moved, err := m.keepOutgoing(*it, u)
	if err != nil {
		return classify(err, "drop the outgoing migration of instance %s", u)
	}
	m.releaseMigration(it.ID)
	if moved != "" {
		// The destination dropped its claim of the instance (AbortIncoming
		// comes first); a claim still there keeps its own part.
		m.fleetMove(ctx, moved, u, "the allocation of instance "+u)
	}
	m.emit(Event{Kind: EventInstanceChanged, ID: u, Op: "migrate-out", Detail: "the VM stayed on this host"})
	return nil
}

// migrationCall begins one of the calls that act on a migration's intent
// and its VM's definitions (ending it, moving the definition): they run
// one at a time on a host (migEnd), since each reads the intent, asks
// libvirt and acts on what it read.
func (m *Manager) migrationCall() (end func(), err error) {
	done, err := m.begin()
	if err != nil {
		return nil, err
	}
	m.migEnd.Lock()
	return func() { m.migEnd.Unlock(); done() }, nil
}

// migrationOf reads the intent of op naming instance u (nil: none) and
// the instance's record (missing: none).
func (m *Manager) migrationOf(op store.Op, u string) (*store.Intent, store.Instance, bool, error) {
	var it *store.Intent
	var rec store.Instance
	missing := false
	err := m.db.View(func(tx *store.Tx) (err error) {
		if it, err = migrationIntent(tx, op, u); err != nil {
			return err
		}
		rec, err = tx.Instance(u)
		if errors.Is(err, store.ErrNotFound) {
			missing, err = true, nil
		}
		return err
	})
	if err != nil {
		return nil, rec, false, classify(err, "read instance %s", u)
	}
	return it, rec, missing, nil
}

// errMigrationEnded: the migration's intent went between its read and the
// transaction acting on it.
var errMigrationEnded = errors.New("migration ended meanwhile")

// releaseMigrated releases an instance a migration gives up (the source's
// after its VM left, the destination's when its VM did not come): in one
// transaction the attachment record goes and the migration's intent
// becomes a destroy, which a crash leaves for reconcile to finish.
// underAdmit: the caller holds the admission lock (reconcile).
func (m *Manager) releaseMigrated(ctx context.Context, it store.Intent, rec store.Instance, missing bool, what string, underAdmit bool) error {
	if missing {
		return classify(m.dropIntent(it.ID), "drop the %s migration of instance %s", what, it.Instance)
	}
	destroy := uuid.NewString()
	defer m.inflight.add(destroy, rec.UUID)()
	if !underAdmit {
		m.admit.Lock()
	}
	err := m.db.Update(func(tx *store.Tx) error {
		if _, err := tx.Intent(it.ID); errors.Is(err, store.ErrNotFound) {
			// Ended meanwhile (reconcile resolved it): act on nothing.
			return errMigrationEnded
		} else if err != nil {
			return err
		}
		r, err := tx.Instance(rec.UUID)
		if err != nil {
			return err
		}
		if err := tx.DeleteAttachment(r.UUID); err != nil {
			return err
		}
		r.State, r.Updated = store.StateDestroying, m.now()
		if err := tx.PutInstance(&r); err != nil {
			return err
		}
		rec = r
		if err := tx.PutIntent(store.Intent{ID: destroy, Op: store.OpDestroy, Instance: r.UUID, Started: m.now()}); err != nil {
			return err
		}
		return tx.DeleteIntent(it.ID)
	})
	if !underAdmit {
		m.admit.Unlock()
	}
	if errors.Is(err, errMigrationEnded) {
		return fail(ErrConflict, nil, "the %s migration of instance %s was ended meanwhile (a reconcile resolved it by where libvirt has the VM): check with vgpuctl list", what, rec.UUID)
	}
	if err != nil {
		return classify(err, "release instance %s after its %s migration", rec.UUID, what)
	}
	m.crash(CrashMigrationRelease)
	if err := m.finishDestroy(ctx, rec, destroy, m.now()); err != nil {
		// The destroy's intent stays: reconcile finishes it.
		return err
	}
	return nil
}
