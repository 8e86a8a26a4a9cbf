package manager

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vgpud/vgpud/internal/hostcall"
	"github.com/vgpud/vgpud/pkg/discover"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
)

// MIGBackend is what the manager needs from the NVML backend.
type MIGBackend interface {
	SetMIGMode(ctx context.Context, gpuUUID string, enable bool) error
	CreateGPUInstance(ctx context.Context, gpuUUID string, profileID, start int) (gpu.GPUInstance, error)
	DestroyGPUInstance(ctx context.Context, gpuUUID string, giID int) error
	// CreateComputeInstance: ciProfile -1 is the one covering the GPU
	// instance; start -1 lets the driver choose (reference 3.3).
	CreateComputeInstance(ctx context.Context, gpuUUID string, giID, ciProfile, start int) (gpu.ComputeInstance, error)
	DestroyComputeInstance(ctx context.Context, gpuUUID string, giID, ciID int) error
	SetHeterogeneous(ctx context.Context, gpuUUID string, on bool) error
	// Quiesce waits until calls that outran their deadline have returned.
	Quiesce(ctx context.Context) error
}

// VGPUBackend is what the manager needs from the sysfs backend. Its calls
// are plain system calls; the manager bounds them with the context.
type VGPUBackend interface {
	SetVFType(vf string, typeID int) error
	ClearVF(vf string) error
	VF(vf string) (gpu.VF, error)
	CreateMdev(parent string, typeID int, uuid string) error
	RemoveMdev(uuid string) error
	Mdev(uuid string) (gpu.Mdev, error)
}

// Discoverer reads the host.
type Discoverer interface {
	Inventory(ctx context.Context) (gpu.Inventory, error)
	// GPU re-reads one GPU.
	GPU(ctx context.Context, uuid string) (gpu.GPU, error)
}

// NVMLBackend is the NVML backend as the manager uses it: the MIG and
// mode changes it makes, and the reads its discovery joins with sysfs
// (every GPU, and one GPU again).
type NVMLBackend interface {
	MIGBackend
	discover.NVML
	Describe(ctx context.Context, uuid string) (gpu.GPU, error)
}

// SysfsBackend is the sysfs backend as the manager uses it: the vGPU
// changes it makes, and the PCI view its discovery reads.
type SysfsBackend interface {
	VGPUBackend
	discover.Sysfs
}

// Config is what a Manager is made of and how it behaves.
type Config struct {
	// Catalog is the GPU catalog (SetCatalog replaces it).
	Catalog *profile.Catalog
	// Store holds the records and intents.
	Store *store.DB
	// NVML and Sysfs are the host's two backends; the manager discovers
	// the host by joining them (pkg/discover).
	NVML  NVMLBackend
	Sysfs SysfsBackend
	// Virt is the libvirt connection. nil: none yet (SetVirt sets it);
	// attach operations then fail with ErrBackendFailure ("libvirt not
	// configured").
	Virt   Virt
	Logger *slog.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Crash is called at every named crash point (crash.go); nil: never crash.
	Crash func(point string)
	// BusyRetry bounds how long a release waits for a VM to let go of a
	// device (the driver's EPERM/EBUSY while QEMU exits). Default 10s.
	BusyRetry time.Duration
	// Degraded, when set, says why carving is refused (the driver never came).
	Degraded string
	// UndefinePolicy is what reconcile does with the instances of a VM that
	// was undefined while nobody watched: "release" (destroy them) or
	// "keep" (the default). WatchVirt's policy replaces it.
	UndefinePolicy string
	// BootID names the host's current boot (/proc/sys/kernel/random/boot_id);
	// a GPU failed in an earlier boot was reset by the reboot. nil: unknown,
	// failed GPUs stay failed until cleared.
	BootID func() string
	// RecoveryConcurrency is how many GPUs reconcile restores at once
	// (restoreAll); 0: DefaultRecoveryConcurrency.
	RecoveryConcurrency int
	// Reset resets GPUs for the MIG mode changes that need it
	// (migreset.go); nil: such a change is left pending for an operator.
	Reset GPUResetter
	// GPUReset is GPUResetAllow (the default) or GPUResetNever: an
	// operator who forbids resets gets the manual procedure.
	GPUReset string
	// MigrationHold is how long a VM's move to or from another host
	// belongs to the calls that make it before reconcile resolves it by
	// where libvirt has the VM (migrate_resolve.go); 0: DefaultMigrationHold.
	MigrationHold time.Duration
}

// Manager runs the operations.
type Manager struct {
	log   *slog.Logger
	db    *store.DB
	mig   MIGBackend
	vgpu  VGPUBackend
	disc  Discoverer
	now   func() time.Time
	crash func(string)
	retry time.Duration
	// reset and resetPolicy: the GPU resets of MIG mode changes.
	reset       GPUResetter
	resetPolicy string
	// recovery bounds how many GPUs reconcile restores at once.
	recovery int

	// Lock order. A goroutine takes these locks only in this order (any of
	// them may be skipped) and never takes one while it holds a later one:
	//
	//  1. admit.
	//  2. One GPU's lock (gpuLock), and only one at a time: a move lets go
	//     of the old GPU's lock before it takes the new GPU's.
	//  3. A store transaction (db.Update, db.View: bbolt's own locks). No
	//     transaction is begun inside another.
	//  4. Leaves, under which no other lock is taken and the store is not
	//     called: invMu (read by snapshot inside transactions), confMu,
	//     gpuMu (only inside gpuLock), inflight's, the migration holds' and the
	//     event broadcaster's mutexes, opsMu, the scheduler table's mutex.
	//
	// So admission (Create, UpdateTenant, UndefineTenant), Destroy's
	// intent, mode changes, Defragment and reconcile's host pass take admit
	// and then, some of them, a GPU's lock; carving and undoing take a
	// GPU's lock and then write the store. Methods that take admit
	// (Destroy, Reconcile) are never called with a lock held: reconcile's
	// libvirt pass, which destroys instances, runs after admit is let go.

	// admit serializes admission decisions and reconcile's host pass.
	admit sync.Mutex
	// gpuLocks serialize carving and releasing on one GPU; gpuMu guards
	// the map.
	gpuMu    sync.Mutex
	gpuLocks map[string]*sync.Mutex

	// invMu guards inv, reads, readOf, degraded, failedGPUs and switching.
	invMu sync.RWMutex
	inv   gpu.Inventory
	// reads numbers host reads; readOf is the number of the read each
	// cached GPU came from (see readTicket).
	reads    uint64
	readOf   map[string]uint64
	degraded string
	// failedGPUs are GPUs an XID or loss marked failed; carving there is
	// refused. The store keeps them across restarts (loadGPUState).
	failedGPUs map[string]GPUFault
	boot       func() string
	// switching are GPUs whose MIG mode SetMIGMode is changing: admission
	// places nothing there meanwhile (guarded by invMu).
	switching map[string]bool

	// fleet is the fleet's claim service (fleet.go); nil when no Placement
	// is configured. Swapped on reload, read without a lock.
	fleet atomic.Pointer[fleetHolder]
	// confMu guards what SetCatalog and SetVirt replace while the daemon runs.
	confMu sync.RWMutex
	cat    *profile.Catalog
	grids  map[string]*placement.Grid
	virt   Virt
	// undefinePolicy is what to do with the instances of an undefined VM
	// ("release" or "keep"; "" keeps): WatchVirt applies it to events,
	// reconcile to VMs undefined while nobody watched.
	undefinePolicy string
	// dirty are GPUs a reconcile pass changed and re-reads at its end
	// (guarded by admit).
	dirty map[string]bool
	// inflight: intents of operations in flight, which reconcile leaves
	// alone.
	inflight inflightSet
	// decisions counts the placements the admission searched for
	// (decide), a create's claim and its admission together once when
	// nothing changed between them (basis).
	decisions atomic.Int64
	// calls counts sysfs calls that outran their deadline (see quiesce).
	calls hostcall.Tracker

	events *broadcaster
	// drift: the foreign devices already announced (drift.go).
	drift driftState
	// discoveryErrs: the GPUs' discovery errors already logged (foreign.go).
	discoveryErrs seenSet

	// sched sets GPUs' vGPU schedulers (nil: the backend cannot); scheds
	// are the pinned settings the driver has not taken yet (sched.go).
	sched  SchedulerBackend
	scheds schedTable
	// gisched sets GPU instances' schedulers (nil: the backend cannot);
	// gischeds are their pins not on the host yet, by giKey (sched_gi.go).
	gisched  GPUInstanceSchedulerBackend
	gischeds schedTable

	// migr reads vGPU migration metadata and asks the driver about them
	// (nil: the backend cannot); migHold and migHolds: how long, and
	// which, migrations' intents are held between their calls (migrate.go).
	migr     MigrationBackend
	migHold  time.Duration
	migHolds migrationHolds
	// migEnd serialises the calls that end a migration or move its VM's
	// definition (migrationCall): each reads the intent, asks libvirt and
	// acts on what it read, so two at once (a retry while the first is
	// slow, a commit and an abort, an undefine and a commit) would act on
	// a stale read; MigrationSource's move of the allocation
	// (moveOutgoing) takes it too. Taken before admit, never under it.
	migEnd sync.Mutex

	// opsMu guards closing and the adding to ops.
	opsMu   sync.Mutex
	ops     sync.WaitGroup
	closing bool
}

// New returns a manager made of c.
func New(c Config) *Manager {
	m := &Manager{
		log: c.Logger, db: c.Store, mig: c.NVML, vgpu: c.Sysfs, disc: discover.Host{NVML: c.NVML, Sysfs: c.Sysfs}, virt: c.Virt,
		now: c.Now, crash: c.Crash, retry: c.BusyRetry, reset: c.Reset, resetPolicy: c.GPUReset, degraded: c.Degraded,
		gpuLocks:   map[string]*sync.Mutex{},
		failedGPUs: map[string]GPUFault{}, boot: c.BootID, undefinePolicy: c.UndefinePolicy, events: newBroadcaster(), dirty: map[string]bool{}, readOf: map[string]uint64{}, switching: map[string]bool{},
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	m.recovery = c.RecoveryConcurrency
	if m.recovery <= 0 {
		m.recovery = DefaultRecoveryConcurrency
	}
	m.sched, _ = c.NVML.(SchedulerBackend)
	m.gisched, _ = c.NVML.(GPUInstanceSchedulerBackend)
	m.migr, _ = c.NVML.(MigrationBackend)
	if m.migHold = c.MigrationHold; m.migHold <= 0 {
		m.migHold = DefaultMigrationHold
	}
	if m.now == nil {
		m.now = time.Now
	}
	if m.crash == nil {
		m.crash = func(string) {}
	}
	if m.retry == 0 {
		m.retry = 10 * time.Second
	}
	m.SetCatalog(c.Catalog)
	return m
}

// SetCatalog replaces the GPU catalog (SIGHUP): new requests plan with it;
// records and the host are untouched.
func (m *Manager) SetCatalog(cat *profile.Catalog) {
	grids := map[string]*placement.Grid{}
	for _, md := range cat.Models() {
		if md.MIG != nil {
			grids[md.Name] = placement.GridFromModel(md)
		}
	}
	m.confMu.Lock()
	m.cat, m.grids = cat, grids
	m.confMu.Unlock()
}

// Catalog is the catalog in force (the one given at New or the last
// SetCatalog).
func (m *Manager) Catalog() *profile.Catalog { return m.catalog() }

func (m *Manager) catalog() *profile.Catalog {
	m.confMu.RLock()
	defer m.confMu.RUnlock()
	return m.cat
}

func (m *Manager) grid(model string) *placement.Grid {
	m.confMu.RLock()
	defer m.confMu.RUnlock()
	return m.grids[model]
}

// SetVirt sets (or, with nil, drops) the libvirt connection; the daemon
// connects after start-up, so that libvirtd, ordered after vgpud at boot,
// is not waited for.
func (m *Manager) SetVirt(v Virt) {
	m.confMu.Lock()
	m.virt = v
	m.confMu.Unlock()
}

// lv is the libvirt connection, nil when there is none.
func (m *Manager) lv() Virt {
	m.confMu.RLock()
	defer m.confMu.RUnlock()
	return m.virt
}

// SetDegraded marks the manager degraded (reads work, carving is refused
// with why) or, with "", healthy.
func (m *Manager) SetDegraded(why string) {
	m.invMu.Lock()
	m.degraded = why
	m.invMu.Unlock()
}

// Degraded returns why carving is refused, or "".
func (m *Manager) Degraded() string {
	m.invMu.RLock()
	defer m.invMu.RUnlock()
	return m.degraded
}

func (m *Manager) gpuLock(uuid string) *sync.Mutex {
	m.gpuMu.Lock()
	defer m.gpuMu.Unlock()
	l, ok := m.gpuLocks[uuid]
	if !ok {
		l = &sync.Mutex{}
		m.gpuLocks[uuid] = l
	}
	return l
}

// Inventory returns the last discovered inventory.
func (m *Manager) Inventory() gpu.Inventory {
	m.invMu.RLock()
	defer m.invMu.RUnlock()
	return m.inv
}

// Refresh re-discovers the whole host. A GPU that changed is announced
// (EventGPUChanged), so caches of the inventory follow.
func (m *Manager) Refresh(ctx context.Context) error {
	t := m.readTicket()
	inv, err := m.disc.Inventory(ctx)
	if err != nil {
		return classify(err, "discover the host")
	}
	var changed []string
	m.invMu.Lock()
	prev := map[string]*gpu.GPU{}
	for i := range m.inv.GPUs {
		prev[m.inv.GPUs[i].UUID] = &m.inv.GPUs[i]
	}
	for i, g := range inv.GPUs {
		p := prev[g.UUID]
		if m.readOf[g.UUID] > t && p != nil {
			// A read that began after this one stored the GPU: it is newer.
			inv.GPUs[i] = *p
			continue
		}
		m.readOf[g.UUID] = t
		if p == nil || !reflect.DeepEqual(*p, g) {
			changed = append(changed, g.UUID)
		}
	}
	m.inv = inv
	m.invMu.Unlock()
	for _, id := range changed {
		m.emit(Event{Kind: EventGPUChanged, ID: id})
	}
	return nil
}

// readTicket numbers a host read. Of two reads of one GPU, the one that
// began later is kept: it saw every change finished before it began, and
// every change is followed by a read of its GPU that begins after it.
func (m *Manager) readTicket() uint64 {
	m.invMu.Lock()
	defer m.invMu.Unlock()
	m.reads++
	return m.reads
}

// refreshGPU re-reads one GPU into the cached inventory.
func (m *Manager) refreshGPU(ctx context.Context, uuid string) {
	t := m.readTicket()
	g, err := m.disc.GPU(ctx, uuid)
	if err != nil {
		m.log.Warn("re-read GPU", "gpu", uuid, "err", err)
		return
	}
	m.invMu.Lock()
	defer m.invMu.Unlock()
	if m.readOf[uuid] > t {
		return // a later read already stored it
	}
	m.readOf[uuid] = t
	// Copy on write: Inventory hands out the slice to readers.
	gpus := make([]gpu.GPU, 0, len(m.inv.GPUs)+1)
	found := false
	for _, x := range m.inv.GPUs {
		if x.UUID == uuid {
			x, found = g, true
		}
		gpus = append(gpus, x)
	}
	if !found {
		gpus = append(gpus, g)
	}
	m.inv.GPUs = gpus
}

// gpuByAnyID finds a GPU by UUID, PCI address or NVML index.
func (m *Manager) gpuByAnyID(id string) (gpu.GPU, error) {
	inv := m.Inventory()
	for _, g := range inv.GPUs {
		if g.UUID == id || g.PCI == id || fmt.Sprint(g.Index) == id {
			return g, nil
		}
	}
	if norm, err := gpu.NormalizePCI(id); err == nil {
		for _, g := range inv.GPUs {
			if g.PCI == norm {
				return g, nil
			}
		}
	}
	return gpu.GPU{}, fail(ErrNotFound, nil, "no GPU %q on this host (run `vgpuctl gpus`)", id)
}

// sysfsCall bounds a sysfs call with the context: a write into sysfs can
// block (mdev remove waits for the device to be released on new kernels).
func (m *Manager) sysfsCall(ctx context.Context, fn func() error) error {
	_, err := sysfsRead(ctx, m, func() (struct{}, error) { return struct{}{}, fn() })
	return err
}

// sysfsRead is sysfsCall for a call with a result. The result travels with
// the error, so a call abandoned at the deadline writes nothing the caller
// reads; quiesce waits for such calls.
func sysfsRead[T any](ctx context.Context, m *Manager, fn func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	r, err := hostcall.Go(ctx, &m.calls, func() result {
		v, err := fn()
		return result{v, err}
	})
	if err != nil {
		var zero T
		return zero, fmt.Errorf("sysfs call: %w: %w", gpu.ErrTimeout, err)
	}
	return r.v, r.err
}

// quiesce waits until every host call that outran its deadline (sysfs here,
// NVML in the backend) has returned: an undo that read the host before a
// late call landed would leave that call's device behind.
func (m *Manager) quiesce(ctx context.Context) error {
	if err := m.calls.Quiesce(ctx); err != nil {
		return fmt.Errorf("wait for sysfs calls that timed out: %w", err)
	}
	if err := m.mig.Quiesce(ctx); err != nil {
		return fmt.Errorf("wait for NVML calls that timed out: %w", err)
	}
	return nil
}
