package manager

import (
	"context"
	"fmt"
	"slices"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/store"
)

// The GPU settings the driver keeps in memory only: heterogeneous vGPU mode
// and the device-level vGPU scheduler revert to the driver's defaults on a
// GPU reset, a VF rebind (sriov-manage -e) and a driver reload, as on a
// reboot. vgpud records what the operator chose (store.GPU) and puts it
// back, in the driver's order: the VFs are there (the host's doing),
// heterogeneous mode is set while the GPU holds no vGPU, the scheduler
// while no vGPU runs, then the instances are re-created (reconcileHost).

// Values of Event.Setting for a DriftSettings event, and of the setting
// label of vgpud_settings_restored_total.
const (
	SettingHeterogeneous = "heterogeneous"
	SettingScheduler     = "scheduler"
)

// DriftSettings is the EventDrift op of a setting the driver lost and vgpud
// set again.
const DriftSettings = "settings"

// Values of Event.Cause for a DriftSettings event: which pass found the
// setting lost.
const (
	// CauseDrift: the periodic check, while vgpud ran (a GPU reset, a VF
	// rebind or a driver reload: the driver does not say which).
	CauseDrift = "drift"
	// CauseReconcile: a reconcile pass (at start after a reboot, after a
	// fault).
	CauseReconcile = "reconcile"
)

type causeKey struct{}

// withCause marks ctx as a pass started for cause.
func withCause(ctx context.Context, cause string) context.Context {
	return context.WithValue(ctx, causeKey{}, cause)
}

func causeOf(ctx context.Context) string {
	if c, ok := ctx.Value(causeKey{}).(string); ok {
		return c
	}
	return CauseReconcile
}

// settingsLost lists the GPUs whose recorded heterogeneous mode or pinned
// scheduler the driver no longer holds and that a reconcile can set now:
// a GPU still holding vGPUs (heterogeneous mode) or whose pin waits for
// its VMs (scheduler) is left to the pending retries, so that one
// unsettable setting does not reconcile at every check.
func (m *Manager) settingsLost(ctx context.Context) ([]string, error) {
	var sts []store.GPU
	if err := m.db.View(func(tx *store.Tx) (err error) { sts, err = tx.GPUs(); return err }); err != nil {
		return nil, classify(err, "read GPU state")
	}
	var out []string
	for _, st := range sts {
		g := m.hostGPU(st.UUID)
		if g == nil || g.Lost {
			continue
		}
		// The mode exists on a time-sliced vGPU GPU only (MIG on: the
		// driver answers NOT_SUPPORTED, and the record waits).
		timeSliced := !g.MIG.Enabled && g.VGPU.Flavour != "" && g.VGPU.Flavour != gpu.FlavourNone
		if st.Heterogeneous != nil && timeSliced && g.VGPU.Heterogeneous != *st.Heterogeneous && !hostHoldsVGPUs(g) {
			out = append(out, st.UUID)
			continue
		}
		if st.Scheduler != nil && m.schedulerUsable(g) == nil && m.scheds.get(g.UUID) == "" &&
			m.schedulerLost(ctx, g.UUID, gpu.VGPUScheduler{Policy: st.Scheduler.Policy, Timeslice: st.Scheduler.Timeslice}) {
			out = append(out, st.UUID)
		}
	}
	return out, nil
}

// settingsWorthTrying keeps the GPUs of lost that the driver did not
// refuse at an earlier check on the GPU as it is now (its print): a
// setting refused once (reported pending by that reconcile) is tried
// again when the GPU changes, not at every check. A GPU no longer in lost
// is forgotten, so a later loss is tried at once.
func (s *driftState) settingsWorthTrying(lost []string, prints map[string]string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	kept := map[string]string{}
	for _, id := range lost {
		if was, ok := s.settingsRefused[id]; ok && was == prints[id] {
			kept[id] = was
			continue
		}
		out = append(out, id)
	}
	s.settingsRefused = kept
	return out
}

// noteSettingsRefused records the GPUs whose settings a reconcile tried
// and left lost, with their prints then.
func (s *driftState) noteSettingsRefused(tried, still []string, prints map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.settingsRefused == nil {
		s.settingsRefused = map[string]string{}
	}
	for _, id := range still {
		if slices.Contains(tried, id) {
			s.settingsRefused[id] = prints[id]
		}
	}
}

// schedulerLost reports whether the driver answered with a scheduler on
// the GPU other than s: a pin the driver forgot. A read that fails says
// nothing of a loss (reporting one would count a restore at every check
// of a GPU whose reads fail).
func (m *Manager) schedulerLost(ctx context.Context, gpuUUID string, s gpu.VGPUScheduler) bool {
	cur, err := m.sched.VGPUScheduler(ctx, gpuUUID)
	return err == nil && (cur.Policy != s.Policy || (s.Timeslice != 0 && cur.Timeslice != gpu.SettableTimeslice(s.Timeslice)))
}

// settingRestored says that a setting the driver had lost is set again: a
// log line, EventDrift (op DriftSettings: the HostDrift signal, the drift
// and settings-restored counters) and EventGPUChanged.
func (m *Manager) settingRestored(ctx context.Context, g *gpu.GPU, setting, value string) {
	cause := causeOf(ctx)
	m.log.Info("GPU setting lost by the driver set again", "gpu", g.PCI, "setting", setting, "value", value, "found_by", cause)
	m.emit(Event{Kind: EventDrift, ID: g.UUID, Op: DriftSettings, Setting: setting, Cause: cause,
		Detail: fmt.Sprintf("GPU %s: %s %s lost (a GPU reset, VF rebind, driver reload or reboot): set again", g.PCI, setting, value)})
	m.emit(Event{Kind: EventGPUChanged, ID: g.UUID})
}
