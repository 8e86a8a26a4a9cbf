package manager

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
)

// Per-GPU-instance vGPU scheduler control (Blackwell GB20x: the vGPUs of
// one GPU instance take turns under a scheduler of that GPU instance). An
// operator pins a GPU instance's policy and time slice; the pin is kept in
// the store by the GPU instance's profile and placement, because the
// driver forgets the setting when the GPU instance is destroyed and when
// the module is unloaded: vgpud sets it again on the GPU instance it finds
// (or re-creates) there, at reconcile and at each WatchSchedulers tick.
// The driver takes a change only while no VM runs in the GPU instance; the
// pin is pending until then.

// GPUInstanceSchedulerBackend is what the manager needs to set a GPU
// instance's scheduler; the NVML backend has it. A read fails with
// gpu.ErrNotSupported where the GPU or driver has no such scheduler; a
// set also while a VM runs in the GPU instance.
type GPUInstanceSchedulerBackend interface {
	GPUInstanceScheduler(ctx context.Context, gpuUUID string, giID int) (gpu.VGPUScheduler, error)
	SetGPUInstanceScheduler(ctx context.Context, gpuUUID string, giID int, s gpu.VGPUScheduler) error
}

// GPUInstanceSchedulerView is one GPU instance's scheduler as vgpud
// manages it: a pinned setting (with the GPU instance it applies to now,
// -1 while none is at its placement), or adaptive for a GPU instance
// nothing pins (the share loop steers it).
type GPUInstanceSchedulerView struct {
	GPUInstance int    `json:"gpuInstance"`
	ProfileID   int    `json:"profileID"`
	Profile     string `json:"profile,omitempty"`
	Start       int    `json:"start"`
	Size        int    `json:"size"`
	// LastGPUInstance is, for a pin whose GPU instance is gone
	// (GPUInstance -1), the id that GPU instance last had, by which an
	// operator drops the pin; -1 where not recorded. For a GPU instance
	// on the GPU it is GPUInstance.
	LastGPUInstance int `json:"lastGPUInstance"`
	SchedulerView
}

// giPendingWhy is what a pending GPU-instance pin waits for.
const giPendingWhy = "the driver refuses a change while a VM runs in the GPU instance; set when it stops"

// giKey names a GPU-instance pin in the pending table.
func giKey(gpuUUID string, profileID, start int) string {
	return fmt.Sprintf("%s/gi-%d@%d", gpuUUID, profileID, start)
}

// SetGPUInstanceScheduler pins the scheduler of GPU instance giID of GPU
// id, or (adaptive) drops the pin. A pin the driver refuses because a VM
// runs in the GPU instance is kept and returned as pending. Refused, with
// nothing changed: a bad request, a GPU without per-GPU-instance
// schedulers (InvalidArgument), a GPU instance the GPU does not have
// (NotFound) or one that hosts no vGPU (InvalidArgument).
func (m *Manager) SetGPUInstanceScheduler(ctx context.Context, id string, giID int, r SchedulerRequest) (GPUInstanceSchedulerView, error) {
	want, err := checkSchedulerRequest(r)
	if err != nil {
		return GPUInstanceSchedulerView{}, err
	}
	if id == "" {
		return GPUInstanceSchedulerView{}, fail(ErrInvalidArgument, nil, "give a GPU (PCI address, UUID or index)")
	}
	if giID < 0 {
		return GPUInstanceSchedulerView{}, fail(ErrInvalidArgument, nil, "GPU instance id %d: give the id of one of the GPU's GPU instances (vgpuctl gpu show lists them)", giID)
	}
	done, err := m.beginCarving()
	if err != nil {
		return GPUInstanceSchedulerView{}, err
	}
	defer done()
	g, err := m.gpuByAnyID(id)
	if err != nil {
		return GPUInstanceSchedulerView{}, err
	}
	if want == nil {
		// Dropping a pin needs no driver: one whose GPU instance is gone
		// (destroyed behind vgpud's back, MIG off) is dropped by the id
		// it last had.
		if v, gone, err := m.dropIfGone(ctx, g, giID); gone {
			return v, err
		}
	}
	if err := m.giSchedulerUsable(&g); err != nil {
		return GPUInstanceSchedulerView{}, err
	}
	l := m.gpuLock(g.UUID)
	l.Lock()
	defer l.Unlock()
	// Under the GPU's lock the GPU instance cannot go; read it from the
	// inventory as it is now.
	if h := m.hostGPU(g.UUID); h != nil {
		g = *h
	}
	x, err := m.vgpuGPUInstance(g, giID)
	if err != nil {
		return GPUInstanceSchedulerView{}, err
	}
	// A read first: it answers while VMs run, so NOT_SUPPORTED here is a
	// driver without the calls, never a VM in the way.
	cur, err := m.gisched.GPUInstanceScheduler(ctx, g.UUID, giID)
	if err != nil {
		if errors.Is(err, gpu.ErrNotSupported) {
			return GPUInstanceSchedulerView{}, fail(ErrInvalidArgument, err, "GPU %s: the driver has no scheduler for GPU instance %d (per-GPU-instance schedulers need a Blackwell GB20x GPU and a driver with NVML's GpuInstance _v2 scheduler calls)", g.PCI, giID)
		}
		return GPUInstanceSchedulerView{}, classify(err, "read the scheduler of GPU instance %d on GPU %s", giID, g.PCI)
	}
	key := giKey(g.UUID, x.ProfileID, x.Placement.Start)
	if want == nil {
		if err := m.putGISchedulerRecord(g, x, nil); err != nil {
			return GPUInstanceSchedulerView{}, err
		}
		m.gischeds.set(key, "")
		m.log.Info("GPU instance scheduler pin dropped", "gpu", g.PCI, "gpuInstance", giID)
		m.emit(Event{Kind: EventPolicySwitched, ID: g.UUID, Op: SchedAdaptive, Detail: fmt.Sprintf("GPU %s GPU instance %d: scheduler pin dropped (the share loop steers it)", g.PCI, giID)})
		m.emit(Event{Kind: EventGPUChanged, ID: g.UUID})
		return m.giSchedulerView(g, x), nil
	}
	rec := gpu.VGPUScheduler{Policy: want.Policy, Timeslice: gpu.SettableTimeslice(want.Timeslice)}
	var setErr error
	if cur.Policy != rec.Policy || (rec.Timeslice != 0 && cur.Timeslice != rec.Timeslice) {
		setErr = m.gisched.SetGPUInstanceScheduler(ctx, g.UUID, giID, *want)
	}
	pending := errors.Is(setErr, gpu.ErrNotSupported)
	if setErr != nil && !pending {
		if errors.Is(setErr, gpu.ErrInvalid) {
			return GPUInstanceSchedulerView{}, failShown(ErrInvalidArgument, setErr, fmt.Sprintf("scheduler of GPU instance %d on GPU %s", giID, g.PCI))
		}
		return GPUInstanceSchedulerView{}, classify(setErr, "set the scheduler of GPU instance %d on GPU %s", giID, g.PCI)
	}
	if setErr == nil && rec.Timeslice != 0 {
		// Record the slice the driver holds, read back (it takes a
		// frequency, so a slice comes back rounded).
		if got, err := m.gisched.GPUInstanceScheduler(ctx, g.UUID, giID); err == nil && got.Policy == rec.Policy && got.Timeslice != 0 {
			rec.Timeslice = got.Timeslice
		}
	}
	if err := m.putGISchedulerRecord(g, x, &rec); err != nil {
		return GPUInstanceSchedulerView{}, err
	}
	what := fmt.Sprintf("GPU %s GPU instance %d: scheduler pinned to %s", g.PCI, giID, schedString(rec))
	if pending {
		m.gischeds.set(key, giPendingWhy)
		m.log.Warn("GPU instance scheduler setting pending", "gpu", g.PCI, "gpuInstance", giID, "policy", rec.Policy, "timeslice", rec.Timeslice, "why", giPendingWhy)
		m.emit(Event{Kind: EventPolicySwitched, ID: g.UUID, Op: "pending", Detail: what + " (pending: " + giPendingWhy + ")"})
	} else {
		m.gischeds.set(key, "")
		m.log.Info("GPU instance scheduler pinned", "gpu", g.PCI, "gpuInstance", giID, "policy", rec.Policy, "timeslice", rec.Timeslice)
		m.emit(Event{Kind: EventPolicySwitched, ID: g.UUID, Op: SchedPinned, Detail: what})
	}
	m.emit(Event{Kind: EventGPUChanged, ID: g.UUID})
	return m.giSchedulerView(g, x), nil
}

// giSchedulerUsable refuses GPUs without per-GPU-instance schedulers.
func (m *Manager) giSchedulerUsable(g *gpu.GPU) error {
	md := m.model(g.Model)
	switch {
	case m.gisched == nil:
		return fail(ErrBackendFailure, nil, "this host's backend cannot set GPU instance schedulers")
	case g.Lost:
		return fail(ErrGPULost, nil, "GPU %s is lost (it does not answer)", g.PCI)
	case md == nil || !md.GPUInstanceScheduler():
		return fail(ErrInvalidArgument, nil, "GPU %s (%s) has no per-GPU-instance vGPU scheduler: only Blackwell GB20x GPUs (RTX PRO 6000 Blackwell) have one; set its scheduler without a GPU instance", g.PCI, modelName(g))
	case !g.MIG.Enabled:
		return fail(ErrInvalidArgument, nil, "GPU %s has MIG off: it has no GPU instances (its time-sliced vGPUs use the GPU's scheduler; set it without a GPU instance)", g.PCI)
	case g.VGPU.Flavour == "" || g.VGPU.Flavour == gpu.FlavourNone:
		return fail(ErrInvalidArgument, nil, "GPU %s has no vGPU manager: it has no vGPU scheduler", g.PCI)
	}
	return nil
}

func modelName(g *gpu.GPU) string {
	if g.Model != "" {
		return g.Model
	}
	return g.Product
}

// vgpuGPUInstance is GPU instance giID of g, which must host vGPUs.
func (m *Manager) vgpuGPUInstance(g gpu.GPU, giID int) (gpu.GPUInstance, error) {
	for _, x := range g.MIG.Instances {
		if x.ID != giID {
			continue
		}
		if !giHostsVGPUs(m.model(g.Model), x.ProfileID) {
			return gpu.GPUInstance{}, fail(ErrInvalidArgument, nil, "GPU instance %d on GPU %s (%s) hosts no vGPU: only GPU instances of a vGPU type's profile have a vGPU scheduler", giID, g.PCI, x.Profile)
		}
		return x, nil
	}
	return gpu.GPUInstance{}, fail(ErrNotFound, nil, "GPU %s has no GPU instance %d (vgpuctl gpu show %s lists them)", g.PCI, giID, g.PCI)
}

// model is the catalog's model name; nil for a GPU the catalog does not
// know (which has no per-GPU-instance scheduler vgpud can tell).
func (m *Manager) model(name string) *profile.Model {
	if md, ok := m.catalog().Model(name); ok {
		return md
	}
	return nil
}

// giHostsVGPUs: some vGPU type of md lives in GPU instances of profile
// profileID.
func giHostsVGPUs(md *profile.Model, profileID int) bool {
	if md == nil || md.VGPU == nil {
		return false
	}
	for _, t := range md.VGPU.Types {
		if t.GPUInstanceProfile != nil && *t.GPUInstanceProfile == profileID {
			return true
		}
	}
	return false
}

// putGISchedulerRecord records (s non-nil) or drops the pin of the GPU
// instance at x's profile and placement.
func (m *Manager) putGISchedulerRecord(g gpu.GPU, x gpu.GPUInstance, s *gpu.VGPUScheduler) error {
	err := m.db.Update(func(tx *store.Tx) error {
		st, err := tx.GPU(g.UUID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		st.UUID, st.PCI = g.UUID, g.PCI
		kept := st.GPUInstanceSchedulers[:0:0]
		for _, p := range st.GPUInstanceSchedulers {
			if p.ProfileID != x.ProfileID || p.Start != x.Placement.Start {
				kept = append(kept, p)
			}
		}
		if s != nil {
			id := x.ID
			kept = append(kept, store.GPUInstanceScheduler{ProfileID: x.ProfileID, Start: x.Placement.Start, Size: x.Placement.Size, GPUInstance: &id,
				Scheduler: store.Scheduler{Policy: s.Policy, Timeslice: s.Timeslice, Since: m.now()}})
			sort.Slice(kept, func(i, j int) bool { return kept[i].Start < kept[j].Start })
		}
		st.GPUInstanceSchedulers = kept
		return tx.PutGPU(st)
	})
	return classify(err, "record the scheduler of a GPU instance on GPU %s", g.PCI)
}

// giSchedulerView is x's scheduler as the store and the pending table
// have it.
func (m *Manager) giSchedulerView(g gpu.GPU, x gpu.GPUInstance) GPUInstanceSchedulerView {
	var st store.GPU
	// NotFound is no pin; a failed read shows the GPU instance adaptive,
	// and the caller reports what it just did, as schedulerView does.
	_ = m.db.View(func(tx *store.Tx) (err error) { st, err = tx.GPU(g.UUID); return err })
	for _, v := range m.giSchedulerViews(g, st.GPUInstanceSchedulers) {
		if v.GPUInstance == x.ID {
			return v
		}
	}
	return GPUInstanceSchedulerView{GPUInstance: x.ID, ProfileID: x.ProfileID, Profile: x.Profile, Start: x.Placement.Start, Size: x.Placement.Size,
		LastGPUInstance: x.ID, SchedulerView: SchedulerView{Mode: SchedAdaptive}}
}

// giSchedulerViews lists the schedulers of g's GPU instances that host
// vGPUs (adaptive unless pinned), then the pins whose GPU instance is not
// on the GPU now (GPUInstance -1); nil for a GPU without such schedulers.
func (m *Manager) giSchedulerViews(g gpu.GPU, pins []store.GPUInstanceScheduler) []GPUInstanceSchedulerView {
	md := m.model(g.Model)
	if (md == nil || !md.GPUInstanceScheduler()) && len(pins) == 0 {
		return nil
	}
	var out []GPUInstanceSchedulerView
	used := make([]bool, len(pins))
	if g.MIG.Enabled {
		for _, x := range g.MIG.Instances {
			if !giHostsVGPUs(md, x.ProfileID) {
				continue
			}
			v := GPUInstanceSchedulerView{GPUInstance: x.ID, ProfileID: x.ProfileID, Profile: x.Profile, Start: x.Placement.Start, Size: x.Placement.Size,
				LastGPUInstance: x.ID, SchedulerView: SchedulerView{Mode: SchedAdaptive}}
			for i, p := range pins {
				if p.ProfileID == x.ProfileID && p.Start == x.Placement.Start {
					used[i] = true
					s := p.Scheduler
					v.SchedulerView = schedulerViewOf(&s, m.gischeds.get(giKey(g.UUID, p.ProfileID, p.Start)))
				}
			}
			out = append(out, v)
		}
	}
	for i, p := range pins {
		if used[i] {
			continue
		}
		s := p.Scheduler
		v := GPUInstanceSchedulerView{GPUInstance: -1, ProfileID: p.ProfileID, Start: p.Start, Size: p.Size, LastGPUInstance: pinID(p), SchedulerView: schedulerViewOf(&s, "")}
		if md != nil {
			if gp, ok := md.GPUInstanceProfileByID(p.ProfileID); ok {
				v.Profile = gp.Name
			}
		}
		v.Pending, v.PendingWhy = true, "no such GPU instance on the GPU now; set when one is created at this placement"
		if p.GPUInstance != nil {
			v.PendingWhy += fmt.Sprintf(", or dropped by the id its GPU instance last had (%d)", *p.GPUInstance)
		}
		out = append(out, v)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	return out
}

// GPUInstanceSchedulers lists the GPU instance schedulers of GPU id.
func (m *Manager) GPUInstanceSchedulers(id string) ([]GPUInstanceSchedulerView, error) {
	g, err := m.gpuByAnyID(id)
	if err != nil {
		return nil, err
	}
	var st store.GPU
	err = m.db.View(func(tx *store.Tx) (err error) { st, err = tx.GPU(g.UUID); return err })
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, classify(err, "read the GPU instance schedulers of GPU %s", g.PCI)
	}
	return m.giSchedulerViews(g, st.GPUInstanceSchedulers), nil
}

// applyGPUInstanceSchedulers sets each pin again on the GPU instance at
// its placement where the driver's setting differs (the GPU instance was
// re-created, the driver reloaded), and says what stays pending. Called
// by reconcile after instances are restored (the GPU instances are back)
// and on WatchSchedulers' tick.
func (m *Manager) applyGPUInstanceSchedulers(ctx context.Context, rep *ReconcileReport) error {
	if m.gisched == nil {
		return nil
	}
	var sts []store.GPU
	if err := m.db.View(func(tx *store.Tx) (err error) { sts, err = tx.GPUs(); return err }); err != nil {
		return classify(err, "read GPU state")
	}
	for _, st := range sts {
		for _, p := range st.GPUInstanceSchedulers {
			if msg := m.applyGPUInstanceScheduler(ctx, st.UUID, p); msg != "" && rep != nil {
				rep.Pending = append(rep.Pending, msg)
			}
		}
	}
	return nil
}

// applyGPUInstanceScheduler tries one pin under its GPU's lock and says
// what is left pending ("" when it holds or has no GPU instance now).
func (m *Manager) applyGPUInstanceScheduler(ctx context.Context, gpuUUID string, p store.GPUInstanceScheduler) string {
	l := m.gpuLock(gpuUUID)
	l.Lock()
	defer l.Unlock()
	g := m.hostGPU(gpuUUID)
	key := giKey(gpuUUID, p.ProfileID, p.Start)
	if g == nil || g.Lost || !g.MIG.Enabled {
		return ""
	}
	x, ok := giAt(*g, p.ProfileID, p.Start)
	if !ok {
		m.gischeds.set(key, "")
		return "" // no GPU instance there now: set when one is created
	}
	if p.GPUInstance == nil || *p.GPUInstance != x.ID {
		m.notePinID(*g, p, x.ID)
	}
	want := gpu.VGPUScheduler{Policy: p.Policy, Timeslice: p.Timeslice}
	cur, err := m.gisched.GPUInstanceScheduler(ctx, gpuUUID, x.ID)
	if err == nil && cur.Policy == want.Policy && (want.Timeslice == 0 || cur.Timeslice == want.Timeslice) {
		m.gischeds.set(key, "")
		return ""
	}
	if err == nil {
		err = m.gisched.SetGPUInstanceScheduler(ctx, gpuUUID, x.ID, want)
	}
	was := m.gischeds.get(key)
	switch {
	case err == nil:
		m.gischeds.set(key, "")
		m.log.Info("GPU instance scheduler pin set again", "gpu", g.PCI, "gpuInstance", x.ID, "policy", want.Policy, "timeslice", want.Timeslice)
		m.emit(Event{Kind: EventPolicySwitched, ID: gpuUUID, Op: "switched", Detail: fmt.Sprintf("GPU %s GPU instance %d: scheduler pin set again: %s", g.PCI, x.ID, schedString(want))})
		m.emit(Event{Kind: EventGPUChanged, ID: gpuUUID})
		return ""
	case errors.Is(err, gpu.ErrNotSupported):
		m.gischeds.set(key, giPendingWhy)
		if was == "" {
			m.emit(Event{Kind: EventGPUChanged, ID: gpuUUID})
		}
		return fmt.Sprintf("GPU %s GPU instance %d: scheduler %s pending: %s", g.PCI, x.ID, schedString(want), giPendingWhy)
	default:
		// Said once per reason: the watcher retries every tick.
		if was != err.Error() {
			m.log.Warn("set the pinned GPU instance scheduler again", "gpu", g.PCI, "gpuInstance", x.ID, "err", err)
		}
		m.gischeds.set(key, err.Error())
		return fmt.Sprintf("GPU %s GPU instance %d: scheduler %s: %v", g.PCI, x.ID, schedString(want), err)
	}
}

// giAt is g's GPU instance of profile profileID at start.
func giAt(g gpu.GPU, profileID, start int) (gpu.GPUInstance, bool) {
	for _, x := range g.MIG.Instances {
		if x.ProfileID == profileID && x.Placement.Start == start {
			return x, true
		}
	}
	return gpu.GPUInstance{}, false
}

// RetryGPUInstanceSchedulers sets the GPU-instance pins the driver does
// not hold (pending ones, and those a re-created GPU instance or a driver
// reload lost). One read per pinned GPU instance; nothing when none is
// pinned.
func (m *Manager) RetryGPUInstanceSchedulers(ctx context.Context) {
	if m.gisched == nil {
		return
	}
	done, err := m.begin()
	if err != nil {
		return
	}
	defer done()
	// A store that cannot be read now is read again at the next tick.
	_ = m.applyGPUInstanceSchedulers(ctx, nil)
}

// retryEvery is WatchSchedulers' pass: the GPUs' pending pins, then the
// GPU instances'.
func (m *Manager) retryEvery(ctx context.Context) {
	m.RetrySchedulers(ctx)
	m.RetryGPUInstanceSchedulers(ctx)
}

// HasGPUInstanceScheduler says whether GPUs of the catalog model have
// per-GPU-instance vGPU schedulers (Blackwell GB20x) this host can set.
func (m *Manager) HasGPUInstanceScheduler(model string) bool {
	md := m.model(model)
	return m.gisched != nil && md != nil && md.GPUInstanceScheduler()
}
