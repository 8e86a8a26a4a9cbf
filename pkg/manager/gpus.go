package manager

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/store"
)

// GPUView is one GPU with vgpud's view of it.
type GPUView struct {
	gpu.GPU
	// State is ok, lost, failed (an XID or fault) or passthrough.
	State gpu.State `json:"state"`
	// Reason says why a GPU is failed.
	Reason string `json:"reason,omitempty"`
	// Instances are the records on this GPU.
	Instances []string `json:"instances,omitempty"`
	// Scheduler is the time-sliced vGPU scheduler's control (nil: the GPU
	// has none: MIG on, no vGPU manager).
	Scheduler *SchedulerView `json:"scheduler,omitempty"`
	// GPUInstanceSchedulers are the schedulers of its GPU instances
	// (Blackwell GB20x only; sched_gi.go).
	GPUInstanceSchedulers []GPUInstanceSchedulerView `json:"gpuInstanceSchedulers,omitempty"`
}

// GPUs lists the host's GPUs as last discovered.
func (m *Manager) GPUs() ([]GPUView, error) {
	var out []GPUView
	err := m.db.View(func(tx *store.Tx) error {
		s, err := m.snapshot(tx)
		if err != nil {
			return err
		}
		sts, err := tx.GPUs()
		if err != nil {
			return err
		}
		pinned := map[string]*store.Scheduler{}
		giPins := map[string][]store.GPUInstanceScheduler{}
		for _, st := range sts {
			pinned[st.UUID], giPins[st.UUID] = st.Scheduler, st.GPUInstanceSchedulers
		}
		for i := range s.inv.GPUs {
			g := s.inv.GPUs[i]
			v := GPUView{GPU: g}
			v.State, v.Reason = s.state(&g)
			for _, r := range s.byGPU[g.UUID] {
				v.Instances = append(v.Instances, r.UUID)
			}
			sort.Strings(v.Instances)
			if pinned[g.UUID] != nil || (!g.MIG.Enabled && g.VGPU.Flavour != "" && g.VGPU.Flavour != gpu.FlavourNone) {
				sv := schedulerViewOf(pinned[g.UUID], m.scheds.get(g.UUID))
				v.Scheduler = &sv
			}
			v.GPUInstanceSchedulers = m.giSchedulerViews(g, giPins[g.UUID])
			out = append(out, v)
		}
		return nil
	})
	if err != nil {
		return nil, classify(err, "list GPUs")
	}
	return out, nil
}

// GPU returns one GPU by UUID, PCI address or index.
func (m *Manager) GPU(id string) (GPUView, error) {
	g, err := m.gpuByAnyID(id)
	if err != nil {
		return GPUView{}, err
	}
	all, err := m.GPUs()
	if err != nil {
		return GPUView{}, err
	}
	for _, v := range all {
		if v.UUID == g.UUID {
			return v, nil
		}
	}
	return GPUView{}, fail(ErrNotFound, nil, "no GPU %q", id)
}

// SetMIGMode enables or disables MIG on a GPU. It is refused while vgpud
// instances live on the GPU. When the driver leaves the change pending
// until a reset, vgpud resets the GPU (migreset.go) where it may and
// nothing outside it holds the GPU (refused before any change, naming what
// does); where it may not (no resetter, gpuReset: never) the error is
// ErrBusy and says how to commit it.
func (m *Manager) SetMIGMode(ctx context.Context, id string, on bool) error {
	done, err := m.beginCarving()
	if err != nil {
		return err
	}
	defer done()
	g, err := m.gpuByAnyID(id)
	if err != nil {
		return err
	}
	if !g.MIG.Capable {
		return fail(ErrInvalidArgument, nil, "GPU %s (%s) has no MIG", g.PCI, g.Model)
	}
	l, err := m.admitModeChange(&g, on)
	if err != nil {
		return err
	}
	// Where the change will need a reset (the VFs are enabled, vGPUs
	// exist), what would refuse it is named before anything changes.
	// It reads the GPU afresh: a foreign vGPU may be newer than the last
	// discovery.
	if m.resetAllowed() {
		m.refreshGPU(ctx, g.UUID)
		if h := m.hostGPU(g.UUID); h != nil {
			g = *h
		}
	}
	if m.resetAllowed() && (g.VGPU.NumVFs > 0 || hostHoldsVGPUs(&g)) {
		if why := m.migResetBlockers(ctx, &g, nil); why != "" {
			l.Unlock()
			m.invMu.Lock()
			delete(m.switching, g.UUID)
			m.invMu.Unlock()
			return fail(ErrBusy, nil, "MIG mode of GPU %s not changed: a change needs a GPU reset, and something outside vgpud holds the GPU: %s", g.PCI, why)
		}
	}
	// The driver call (up to seconds) runs outside the admission lock:
	// admission places nothing on the GPU until it is re-read.
	err = m.mig.SetMIGMode(ctx, g.UUID, on)
	carried := false
	if errors.Is(err, gpu.ErrResetRequired) && m.resetAllowed() {
		err = m.carryMIGReset(ctx, &g, on)
		carried = err == nil
	}
	l.Unlock()
	m.refreshGPU(ctx, g.UUID)
	if carried {
		m.settingsAfterReset(ctx, &g)
	}
	m.invMu.Lock()
	delete(m.switching, g.UUID)
	m.invMu.Unlock()
	m.emit(Event{Kind: EventGPUChanged, ID: g.UUID})
	if errors.Is(err, gpu.ErrResetRequired) && migSettled(m.hostGPU(g.UUID), on) {
		// The request undid a change still pending (MIG off asked, not
		// yet taken; now on again): the GPU is in the mode asked for,
		// with nothing pending, whatever the driver's activation status
		// said about the pending mode it was given.
		m.log.Info("MIG mode set: a pending change to it was undone", "gpu", g.PCI, "on", on)
		if !on {
			m.dropPinsAfterMIGOff(g)
		}
		return nil
	}
	if errors.Is(err, gpu.ErrResetRequired) {
		why := ""
		if m.reset != nil && m.resetPolicy == GPUResetNever {
			why = " (gpuReset: never: vgpud resets no GPU)"
		}
		return manualReset(&g, err, why)
	}
	if err != nil {
		return classify(err, "set MIG mode on GPU %s", g.PCI)
	}
	m.log.Info("MIG mode set", "gpu", g.PCI, "on", on)
	if !on {
		m.dropPinsAfterMIGOff(g)
	}
	return nil
}

// migSettled: g, as just re-read, is in MIG mode on with no other mode
// pending.
func migSettled(g *gpu.GPU, on bool) bool {
	return g != nil && !g.Lost && g.MIG.Enabled == on && g.MIG.Pending == on
}

// admitModeChange decides, under the admission lock, that g's MIG mode
// may change to on (no vgpud instance on it, for MIG off no GPU instance
// at all, no other change in progress), marks it switching and returns
// its lock, held.
func (m *Manager) admitModeChange(g *gpu.GPU, on bool) (*sync.Mutex, error) {
	m.admit.Lock()
	defer m.admit.Unlock()
	var n int
	if err := m.db.View(func(tx *store.Tx) error {
		s, err := m.snapshot(tx)
		n = len(s.byGPU[g.UUID])
		return err
	}); err != nil {
		return nil, classify(err, "set MIG mode")
	}
	if n > 0 {
		return nil, fail(ErrBusy, nil, "GPU %s holds %d vgpud instances; destroy them before changing its MIG mode", g.PCI, n)
	}
	if !on && len(g.MIG.Instances) > 0 {
		// No record explains them: another tool's. The driver keeps MIG
		// on while they exist (IN_USE), and vgpud never touches them.
		var gis []string
		for _, gi := range g.MIG.Instances {
			name := gi.Profile
			if name == "" {
				name = fmt.Sprintf("profile id %d", gi.ProfileID)
			}
			gis = append(gis, fmt.Sprintf("GI %d (%s, %d compute instances)", gi.ID, name, len(gi.Compute)))
		}
		return nil, fail(ErrBusy, nil, "GPU %s holds GPU instances vgpud did not create: %s; the driver keeps MIG on while they exist: "+
			"destroy them (nvidia-smi mig -i %d -dci, then -dgi) before disabling MIG", g.PCI, strings.Join(gis, ", "), g.Index)
	}
	m.invMu.Lock()
	busy := m.switching[g.UUID]
	m.switching[g.UUID] = true
	m.invMu.Unlock()
	if busy {
		return nil, fail(ErrBusy, nil, "the MIG mode of GPU %s is already being changed; retry shortly", g.PCI)
	}
	// No record on the GPU: only an undo finishing there can hold its
	// lock, briefly.
	l := m.gpuLock(g.UUID)
	l.Lock()
	return l, nil
}

// SetHeterogeneous switches a GPU's time-sliced vGPUs between one type and
// mixed sizes; the driver refuses it while vGPUs exist on the GPU (Busy).
// The choice is kept in the store and applied again after a host reboot,
// which resets the mode, before reconcile re-creates the GPU's vGPUs.
func (m *Manager) SetHeterogeneous(ctx context.Context, id string, on bool) error {
	done, err := m.beginCarving()
	if err != nil {
		return err
	}
	defer done()
	g, err := m.gpuByAnyID(id)
	if err != nil {
		return err
	}
	m.admit.Lock()
	defer m.admit.Unlock()
	l := m.gpuLock(g.UUID)
	l.Lock()
	err = m.mig.SetHeterogeneous(ctx, g.UUID, on)
	l.Unlock()
	m.refreshGPU(ctx, g.UUID)
	if errors.Is(err, gpu.ErrInUse) {
		// IN_USE here means vGPUs exist, attached to a VM or not: stopping
		// a VM does not help, destroying them does.
		return fail(ErrBusy, err, "set heterogeneous vGPU mode on GPU %s: the driver changes it only while the GPU holds no vGPU; destroy the GPU's vGPUs first (vgpuctl list)", g.PCI)
	}
	if err != nil {
		return classify(err, "set heterogeneous vGPU mode on GPU %s", g.PCI)
	}
	if err := m.db.Update(func(tx *store.Tx) error {
		st, err := tx.GPU(g.UUID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		st.UUID, st.PCI, st.Heterogeneous = g.UUID, g.PCI, &on
		return tx.PutGPU(st)
	}); err != nil {
		return classify(err, "record the vGPU mode of GPU %s", g.PCI)
	}
	m.log.Info("vGPU mode set", "gpu", g.PCI, "heterogeneous", on)
	m.emit(Event{Kind: EventGPUChanged, ID: g.UUID})
	return nil
}

// applyVGPUModes sets the vGPU mode the operator chose again on GPUs that
// lost it (a reboot, a GPU reset, a VF rebind or a driver reload resets
// it), while they hold no vGPU. Called by
// reconcile under the admission lock, before instances are re-created.
func (m *Manager) applyVGPUModes(ctx context.Context, rep *ReconcileReport) error {
	var sts []store.GPU
	if err := m.db.View(func(tx *store.Tx) (err error) { sts, err = tx.GPUs(); return err }); err != nil {
		return classify(err, "read GPU state")
	}
	for _, st := range sts {
		g := m.hostGPU(st.UUID)
		if st.Heterogeneous == nil || g == nil || g.Lost || g.VGPU.Heterogeneous == *st.Heterogeneous {
			continue
		}
		if hostHoldsVGPUs(g) {
			rep.Pending = append(rep.Pending, fmt.Sprintf("GPU %s: vGPU mode %s wanted, but vGPUs exist on it", g.PCI, modeName(*st.Heterogeneous)))
			continue
		}
		l := m.gpuLock(g.UUID)
		l.Lock()
		err := m.mig.SetHeterogeneous(ctx, g.UUID, *st.Heterogeneous)
		l.Unlock()
		if err != nil {
			m.log.Warn("apply the chosen vGPU mode again", "gpu", g.PCI, "heterogeneous", *st.Heterogeneous, "err", err)
			rep.Pending = append(rep.Pending, fmt.Sprintf("GPU %s: vGPU mode %s: %s", g.PCI, modeName(*st.Heterogeneous), Message(classify(err, "set"))))
			continue
		}
		m.refreshGPU(ctx, g.UUID)
		m.settingRestored(ctx, g, SettingHeterogeneous, modeName(*st.Heterogeneous))
	}
	return nil
}

func modeName(heterogeneous bool) string {
	if heterogeneous {
		return "heterogeneous"
	}
	return "homogeneous"
}

// hostHoldsVGPUs: the GPU shows a vGPU (a VF with a type, an mdev).
func hostHoldsVGPUs(g *gpu.GPU) bool {
	if len(g.VGPU.Mdevs) > 0 {
		return true
	}
	for _, vf := range g.VGPU.VFs {
		if vf.Type != 0 {
			return true
		}
	}
	return false
}

// MarkGPUFailed refuses new carving on a GPU (an XID, a fault) and fails
// its instances at the next reconcile; "" clears it. The mark is kept in
// the store: a restart of vgpud does not put a GPU that took a critical
// XID back into service, only its recovery (a reset) or an operator does
// (ClearGPU).
func (m *Manager) MarkGPUFailed(uuid, why string) {
	m.markFailed(uuid, why, false)
}

// MarkGPULost is MarkGPUFailed for a GPU that fell off the bus: it is back
// in service when it answers again, across a restart of vgpud too.
func (m *Manager) MarkGPULost(uuid, why string) {
	m.markFailed(uuid, why, true)
}

func (m *Manager) markFailed(uuid, why string, lost bool) {
	pci := ""
	if g := m.hostGPU(uuid); g != nil {
		pci, lost = g.PCI, lost || g.Lost
	}
	boot := m.bootID()
	changed := false
	err := m.db.Update(func(tx *store.Tx) error {
		st, err := tx.GPU(uuid)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if st.Failed == why {
			return nil
		}
		changed = true
		st.UUID, st.Failed = uuid, why
		if pci != "" {
			st.PCI = pci
		}
		st.FailedSince, st.FailedBoot, st.Lost = time.Time{}, "", false
		if why != "" {
			st.FailedSince, st.FailedBoot, st.Lost = m.now(), boot, lost
		}
		return tx.PutGPU(st)
	})
	if err != nil {
		// The mark must hold even when it cannot be recorded: carving there
		// is refused in this run regardless.
		m.log.Error("record GPU failure", "gpu", uuid, "why", why, "err", err)
	}
	m.invMu.Lock()
	if m.failedGPUs[uuid].Why != why {
		changed = true
	}
	if why == "" {
		delete(m.failedGPUs, uuid)
	} else {
		m.failedGPUs[uuid] = GPUFault{Why: why, Lost: lost || m.failedGPUs[uuid].Lost}
	}
	m.invMu.Unlock()
	if !changed {
		return
	}
	kind := EventGPUChanged
	if why != "" {
		kind = EventGPULost
	}
	m.emit(Event{Kind: kind, ID: uuid, Detail: why})
}

// ClearGPU returns a failed GPU to service on an operator's word (after
// checking or resetting it) and reconciles, which brings its instances
// back. ErrNotFound for an unknown GPU; a GPU that is not failed is left
// as it is.
func (m *Manager) ClearGPU(ctx context.Context, id string) (ReconcileReport, error) {
	g, err := m.gpuByAnyID(id)
	if err != nil {
		return ReconcileReport{}, err
	}
	if g.Lost {
		return ReconcileReport{}, fail(ErrGPULost, nil, "GPU %s is lost (it does not answer); it returns to service by itself when it is back", g.PCI)
	}
	m.MarkGPUFailed(g.UUID, "")
	m.log.Info("GPU cleared by an operator", "gpu", g.PCI, "uuid", g.UUID)
	return m.Reconcile(ctx)
}

// GPUFault is why a GPU is out of service.
type GPUFault struct {
	Why string
	// Lost: it fell off the bus; it is back when it answers again. Others
	// (an XID on a GPU that answers) are back after a reset.
	Lost bool
}

// FailedGPUs returns the GPUs marked failed, by UUID.
func (m *Manager) FailedGPUs() map[string]GPUFault {
	m.invMu.RLock()
	defer m.invMu.RUnlock()
	out := make(map[string]GPUFault, len(m.failedGPUs))
	for k, v := range m.failedGPUs {
		out[k] = v
	}
	return out
}

// bootID is the host's boot ID, "" when unknown.
func (m *Manager) bootID() string {
	if m.boot == nil {
		return ""
	}
	return m.boot()
}

// loadGPUState reads the GPU state the store keeps into the manager (at
// the start of a reconcile, so a restart picks up failed GPUs). A GPU that
// failed in an earlier boot of the host was reset by the reboot: it is
// back in service.
func (m *Manager) loadGPUState() error {
	var sts []store.GPU
	if err := m.db.View(func(tx *store.Tx) (err error) { sts, err = tx.GPUs(); return err }); err != nil {
		return classify(err, "read GPU state")
	}
	boot := m.bootID()
	for _, st := range sts {
		if st.Failed == "" {
			continue
		}
		if boot != "" && st.FailedBoot != "" && st.FailedBoot != boot {
			m.log.Info("GPU failed before the host rebooted; the reboot reset it: back in service", "gpu", st.PCI, "uuid", st.UUID, "was", st.Failed)
			m.MarkGPUFailed(st.UUID, "")
			continue
		}
		m.invMu.Lock()
		m.failedGPUs[st.UUID] = GPUFault{Why: st.Failed, Lost: st.Lost}
		m.invMu.Unlock()
	}
	return nil
}
