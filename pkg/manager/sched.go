package manager

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/store"
)

// Per-GPU vGPU scheduler control. An operator either pins a GPU's policy
// and time slice (the share loop then never changes them) or hands the GPU
// to the share loop (adaptive, the default). A pinned setting is kept in
// the store and set again after a reboot, which resets the scheduler,
// before VMs start. The driver takes a change only while no VM with a vGPU
// runs on the GPU (NOT_SUPPORTED otherwise): the setting is then pending,
// shown as such, and set at the first try that finds the GPU's VMs stopped
// (a VM stopping, a reconcile, WatchSchedulers' retry).

// SchedulerBackend is what the manager needs to set a GPU's vGPU
// scheduler; the NVML backend has it. A change while a VM with a vGPU
// runs fails with gpu.ErrNotSupported, a policy or time slice the GPU
// does not offer with gpu.ErrInvalid.
type SchedulerBackend interface {
	VGPUScheduler(ctx context.Context, gpuUUID string) (gpu.VGPUScheduler, error)
	SetVGPUScheduler(ctx context.Context, gpuUUID string, s gpu.VGPUScheduler) error
}

// Scheduler modes.
const (
	// SchedPinned: the operator's policy and time slice; the share loop
	// leaves the GPU alone.
	SchedPinned = "pinned"
	// SchedAdaptive: the share loop chooses the policy (its mode and
	// time slice, vgpud.yaml share:).
	SchedAdaptive = "adaptive"
)

// SchedulerRequest is an operator's scheduler setting for one GPU.
type SchedulerRequest struct {
	// Mode is pinned or adaptive; "" is pinned when Policy is set.
	Mode string
	// Policy and Timeslice are the pinned setting (Timeslice 0: the
	// driver's default); both empty with the adaptive mode.
	Policy    string
	Timeslice time.Duration
}

// SchedulerView is a GPU's scheduler as vgpud manages it.
type SchedulerView struct {
	Mode string `json:"mode"`
	// Policy and Timeslice are the pinned setting (empty when adaptive).
	Policy    string        `json:"policy,omitempty"`
	Timeslice time.Duration `json:"timesliceNs,omitempty"`
	// Pending: the driver refused the pinned setting so far (a VM with a
	// vGPU runs on the GPU); it is set when they stop. PendingWhy says why.
	Pending    bool      `json:"pending,omitempty"`
	PendingWhy string    `json:"pendingWhy,omitempty"`
	Since      time.Time `json:"since,omitempty"`
}

// schedTable is the pinned settings not yet on the host, by GPU UUID. A
// leaf lock: nothing else is taken under it.
type schedTable struct {
	mu      sync.Mutex
	pending map[string]string
}

func (t *schedTable) set(uuid, why string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pending == nil {
		t.pending = map[string]string{}
	}
	if why == "" {
		delete(t.pending, uuid)
		return
	}
	t.pending[uuid] = why
}

func (t *schedTable) get(uuid string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pending[uuid]
}

func (t *schedTable) uuids() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.pending))
	for u := range t.pending {
		out = append(out, u)
	}
	return out
}

// pendingWhy is what a pending setting waits for.
const pendingWhy = "the driver refuses a change while a VM with a vGPU runs on the GPU; set when they stop"

// checkSchedulerRequest validates r and returns the pinned setting (nil
// for adaptive).
func checkSchedulerRequest(r SchedulerRequest) (*gpu.VGPUScheduler, error) {
	mode := r.Mode
	if mode == "" && r.Policy != "" {
		mode = SchedPinned
	}
	switch mode {
	case SchedAdaptive:
		if r.Policy != "" || r.Timeslice != 0 {
			return nil, fail(ErrInvalidArgument, nil, "a policy or time slice pins the GPU; the adaptive mode lets the share loop choose them (give neither)")
		}
		return nil, nil
	case SchedPinned:
	case "":
		return nil, fail(ErrInvalidArgument, nil, "give a policy (best_effort, equal_share, fixed_share) to pin, or the adaptive mode")
	default:
		return nil, fail(ErrInvalidArgument, nil, "scheduler mode %q: want pinned or adaptive", r.Mode)
	}
	if r.Policy == "" {
		return nil, fail(ErrInvalidArgument, nil, "the pinned mode needs a policy (best_effort, equal_share, fixed_share)")
	}
	p, err := gpu.ParseSchedPolicy(r.Policy)
	if err != nil {
		return nil, invalidShown(err)
	}
	if err := gpu.ValidateTimeslice(r.Timeslice); err != nil {
		return nil, invalidShown(err)
	}
	return &gpu.VGPUScheduler{Policy: p, Timeslice: r.Timeslice}, nil
}

// invalidShown is InvalidArgument with err's text as its message, once
// (without the sentinel's own words at its end).
func invalidShown(err error) error {
	return &opError{kind: ErrInvalidArgument, msg: strings.TrimSuffix(err.Error(), ": "+gpu.ErrInvalid.Error()), cause: err, shown: true}
}

// SetGPUScheduler pins a GPU's vGPU scheduler (policy and time slice) or
// hands it to the share loop (adaptive). A pinned setting the driver
// refuses while VMs run is kept and returned as pending; it is set when
// they stop. InvalidArgument for a bad request or a GPU without a
// time-sliced scheduler (MIG on, no vGPU manager), Busy for a pin on a GPU
// passed through whole; nothing is changed then.
func (m *Manager) SetGPUScheduler(ctx context.Context, id string, r SchedulerRequest) (SchedulerView, error) {
	want, err := checkSchedulerRequest(r)
	if err != nil {
		return SchedulerView{}, err
	}
	done, err := m.beginCarving()
	if err != nil {
		return SchedulerView{}, err
	}
	defer done()
	g, err := m.gpuByAnyID(id)
	if err != nil {
		return SchedulerView{}, err
	}
	if err := m.schedulerUsable(&g); err != nil {
		return SchedulerView{}, err
	}
	m.admit.Lock()
	defer m.admit.Unlock()
	if want != nil {
		if err := m.notPassedThrough(g); err != nil {
			return SchedulerView{}, err
		}
	}
	if want == nil {
		// Under the GPU's lock, as the share loop's own changes
		// (UnlessPinned) are.
		l := m.gpuLock(g.UUID)
		l.Lock()
		err := m.putSchedulerRecord(g, nil)
		l.Unlock()
		if err != nil {
			return SchedulerView{}, err
		}
		m.scheds.set(g.UUID, "")
		m.log.Info("vGPU scheduler handed to the share loop", "gpu", g.PCI)
		m.emit(Event{Kind: EventPolicySwitched, ID: g.UUID, Op: SchedAdaptive, Detail: fmt.Sprintf("GPU %s: scheduler handed to the share loop (adaptive)", g.PCI)})
		m.emit(Event{Kind: EventGPUChanged, ID: g.UUID})
		return m.schedulerView(g.UUID), nil
	}
	// The driver call and the record are one step under the GPU's lock:
	// the share loop changes a GPU's scheduler only under that lock and
	// only while the record says adaptive (UnlessPinned), so it can neither
	// land between the two nor after them.
	var recErr error
	err = m.setScheduler(ctx, g, *want, func(err error) {
		if err != nil && !errors.Is(err, gpu.ErrNotSupported) {
			return
		}
		// What the driver holds, or will hold once a pending pin is set
		// (it takes a slice as a whole number of Hz), read back when it can be.
		rec := *want
		rec.Timeslice = gpu.SettableTimeslice(want.Timeslice)
		if err == nil && want.Timeslice != 0 {
			// Record, and so show, the time slice the driver holds, read
			// back: a driver that can take it only as a frequency (the _v2
			// call) rounds it.
			if cur, rerr := m.sched.VGPUScheduler(ctx, g.UUID); rerr == nil && cur.Policy == want.Policy && cur.Timeslice != 0 {
				rec.Timeslice = cur.Timeslice
			}
		}
		*want = rec
		recErr = m.putSchedulerRecord(g, want)
	})
	pending := errors.Is(err, gpu.ErrNotSupported)
	if err != nil && !pending {
		if errors.Is(err, gpu.ErrInvalid) {
			return SchedulerView{}, failShown(ErrInvalidArgument, err, "scheduler of GPU "+g.PCI)
		}
		return SchedulerView{}, classify(err, "set the vGPU scheduler of GPU %s", g.PCI)
	}
	if recErr != nil {
		return SchedulerView{}, recErr
	}
	what := fmt.Sprintf("GPU %s: scheduler pinned to %s", g.PCI, schedString(*want))
	if pending {
		m.scheds.set(g.UUID, pendingWhy)
		m.log.Warn("vGPU scheduler setting pending", "gpu", g.PCI, "policy", want.Policy, "timeslice", want.Timeslice, "why", pendingWhy)
		m.emit(Event{Kind: EventPolicySwitched, ID: g.UUID, Op: "pending", Detail: what + " (pending: " + pendingWhy + ")"})
	} else {
		m.scheds.set(g.UUID, "")
		m.log.Info("vGPU scheduler pinned", "gpu", g.PCI, "policy", want.Policy, "timeslice", want.Timeslice)
		m.emit(Event{Kind: EventPolicySwitched, ID: g.UUID, Op: SchedPinned, Detail: what})
	}
	// GPUChanged: the GPU's properties and the share loop's inventory
	// (which leaves pinned GPUs alone) follow.
	m.emit(Event{Kind: EventGPUChanged, ID: g.UUID})
	return m.schedulerView(g.UUID), nil
}

// schedulerUsable refuses GPUs without a device-level time-sliced
// scheduler: MIG on (the driver answers NOT_SUPPORTED), no vGPU manager.
func (m *Manager) schedulerUsable(g *gpu.GPU) error {
	switch {
	case m.sched == nil:
		return fail(ErrBackendFailure, nil, "this host's backend cannot set the vGPU scheduler")
	case g.Lost:
		return fail(ErrGPULost, nil, "GPU %s is lost (it does not answer)", g.PCI)
	case g.MIG.Enabled:
		return fail(ErrInvalidArgument, nil, "GPU %s has MIG on: it has no device-level vGPU scheduler (MIG slices are not time-sliced)", g.PCI)
	case g.VGPU.Flavour == "" || g.VGPU.Flavour == gpu.FlavourNone:
		return fail(ErrInvalidArgument, nil, "GPU %s has no vGPU manager: it has no vGPU scheduler", g.PCI)
	}
	return nil
}

// notPassedThrough refuses to pin the scheduler of a GPU given whole to an
// instance: the VM's driver owns it, the host's vGPU manager does not
// drive it (on a real host it is bound to vfio-pci), so there is no
// scheduler to set. Handing it to the share loop (dropping a pin) is
// still allowed. Called with m.admit held.
func (m *Manager) notPassedThrough(g gpu.GPU) error {
	var pt *store.Instance
	if err := m.db.View(func(tx *store.Tx) error {
		s, err := m.snapshot(tx)
		if err == nil {
			pt = s.passthroughOn(g.UUID)
		}
		return err
	}); err != nil {
		return classify(err, "set the vGPU scheduler of GPU %s", g.PCI)
	}
	if pt != nil {
		return fail(ErrBusy, nil, "GPU %s is passed through whole (instance %s): it has no vGPU scheduler to set; destroy that instance first", g.PCI, pt.UUID)
	}
	return nil
}

// setScheduler sets s on the GPU under its lock, unless it already holds
// it; then, still under the lock, it hands the outcome to each of then.
func (m *Manager) setScheduler(ctx context.Context, g gpu.GPU, s gpu.VGPUScheduler, then ...func(error)) error {
	l := m.gpuLock(g.UUID)
	l.Lock()
	defer l.Unlock()
	var err error
	if cur, rerr := m.sched.VGPUScheduler(ctx, g.UUID); rerr != nil || cur.Policy != s.Policy || (s.Timeslice != 0 && cur.Timeslice != gpu.SettableTimeslice(s.Timeslice)) {
		err = m.sched.SetVGPUScheduler(ctx, g.UUID, s)
	}
	for _, f := range then {
		f(err)
	}
	return err
}

// UnlessPinned runs set, the share loop's change of a GPU's scheduler,
// under the GPU's lock unless an operator pinned that GPU's scheduler, and
// reports whether it ran. The share loop learns of a pin from its
// inventory only at its next window; this check, under the lock under
// which SetGPUScheduler sets and records a pin, keeps it from overriding
// the pin in between. A GPU whose record cannot be read counts as pinned:
// leaving an operator's setting alone is the safe side.
func (m *Manager) UnlessPinned(ctx context.Context, gpuUUID string, set func() error) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	l := m.gpuLock(gpuUUID)
	l.Lock()
	defer l.Unlock()
	var st store.GPU
	err := m.db.View(func(tx *store.Tx) (err error) { st, err = tx.GPU(gpuUUID); return err })
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return false, classify(err, "read the vGPU scheduler record of GPU %s", gpuUUID)
	case st.Scheduler != nil:
		return false, nil
	}
	return true, set()
}

func (m *Manager) putSchedulerRecord(g gpu.GPU, s *gpu.VGPUScheduler) error {
	err := m.db.Update(func(tx *store.Tx) error {
		st, err := tx.GPU(g.UUID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		st.UUID, st.PCI, st.Scheduler = g.UUID, g.PCI, nil
		if s != nil {
			st.Scheduler = &store.Scheduler{Policy: s.Policy, Timeslice: s.Timeslice, Since: m.now()}
		}
		return tx.PutGPU(st)
	})
	return classify(err, "record the vGPU scheduler of GPU %s", g.PCI)
}

func schedString(s gpu.VGPUScheduler) string {
	if s.Timeslice == 0 {
		return s.Policy + " (the driver's time slice)"
	}
	return fmt.Sprintf("%s, time slice %v", s.Policy, s.Timeslice)
}

// schedulerView is the GPU's scheduler as the store and the pending table
// have it (no driver call: listing GPUs stays cheap).
func (m *Manager) schedulerView(uuid string) SchedulerView {
	var st store.GPU
	// A GPU with no record (NotFound) is adaptive; a failed read leaves the
	// zero record too, and the setting just written is what the caller
	// reports, so the view only lacks what a later read shows.
	_ = m.db.View(func(tx *store.Tx) (err error) { st, err = tx.GPU(uuid); return err })
	return schedulerViewOf(st.Scheduler, m.scheds.get(uuid))
}

func schedulerViewOf(s *store.Scheduler, pending string) SchedulerView {
	if s == nil {
		return SchedulerView{Mode: SchedAdaptive}
	}
	return SchedulerView{Mode: SchedPinned, Policy: s.Policy, Timeslice: s.Timeslice, Since: s.Since, Pending: pending != "", PendingWhy: pending}
}

// applySchedulers sets the pinned settings again on GPUs whose scheduler
// differs (a reboot, a GPU reset, a VF rebind or a driver reload resets
// it). Called by reconcile under the admission
// lock, before instances are re-created and VMs start; a GPU with VMs
// running keeps its setting pending.
func (m *Manager) applySchedulers(ctx context.Context, rep *ReconcileReport) error {
	if m.sched == nil {
		return nil
	}
	var sts []store.GPU
	if err := m.db.View(func(tx *store.Tx) (err error) { sts, err = tx.GPUs(); return err }); err != nil {
		return classify(err, "read GPU state")
	}
	for _, st := range sts {
		if st.Scheduler == nil {
			continue
		}
		if msg := m.applyScheduler(ctx, st); msg != "" {
			rep.Pending = append(rep.Pending, msg)
		}
	}
	return nil
}

// applyScheduler tries one GPU's pinned setting and says what is left
// pending ("" when set or nothing to do).
func (m *Manager) applyScheduler(ctx context.Context, st store.GPU) string {
	g := m.hostGPU(st.UUID)
	if g == nil || g.Lost || m.schedulerUsable(g) != nil {
		return "" // the GPU is gone or changed its mode; the record waits
	}
	want := gpu.VGPUScheduler{Policy: st.Scheduler.Policy, Timeslice: st.Scheduler.Timeslice}
	was := m.scheds.get(g.UUID)
	// A pin not pending that the driver no longer holds was lost (reset,
	// VF rebind, driver reload, reboot): setting it again is reported.
	lost := was == "" && m.schedulerLost(ctx, g.UUID, want)
	err := m.setScheduler(ctx, *g, want)
	switch {
	case err == nil:
		m.scheds.set(g.UUID, "")
		if lost {
			m.settingRestored(ctx, g, SettingScheduler, schedString(want))
		}
		if was != "" {
			m.log.Info("pending vGPU scheduler setting applied", "gpu", g.PCI, "policy", want.Policy, "timeslice", want.Timeslice)
			m.emit(Event{Kind: EventPolicySwitched, ID: g.UUID, Op: "switched", Detail: fmt.Sprintf("GPU %s: pending scheduler setting applied: %s", g.PCI, schedString(want))})
			m.emit(Event{Kind: EventGPUChanged, ID: g.UUID})
		}
		return ""
	case errors.Is(err, gpu.ErrNotSupported):
		m.scheds.set(g.UUID, pendingWhy)
		return fmt.Sprintf("GPU %s: scheduler %s pending: %s", g.PCI, schedString(want), pendingWhy)
	default:
		m.log.Warn("apply the pinned vGPU scheduler setting", "gpu", g.PCI, "err", err)
		m.scheds.set(g.UUID, err.Error())
		return fmt.Sprintf("GPU %s: scheduler %s: %v", g.PCI, schedString(want), err)
	}
}

// RetrySchedulers tries the pending scheduler settings again (after a VM
// stopped, or on WatchSchedulers' tick). Cheap when nothing is pending.
func (m *Manager) RetrySchedulers(ctx context.Context) {
	ids := m.scheds.uuids()
	if len(ids) == 0 || m.sched == nil {
		return
	}
	done, err := m.begin()
	if err != nil {
		return
	}
	defer done()
	m.admit.Lock()
	defer m.admit.Unlock()
	for _, id := range ids {
		var st store.GPU
		if err := m.db.View(func(tx *store.Tx) (err error) { st, err = tx.GPU(id); return err }); err != nil || st.Scheduler == nil {
			m.scheds.set(id, "")
			continue
		}
		m.applyScheduler(ctx, st)
	}
}

// WatchSchedulers retries pending scheduler settings, the GPUs' and the
// GPU instances' (sched_gi.go), every interval until
// ctx ends: a VM stopping is not always a libvirt event vgpud sees (QEMU
// letting go of the vGPU is the driver's business).
func (m *Manager) WatchSchedulers(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.retryEvery(ctx)
		}
	}
}
