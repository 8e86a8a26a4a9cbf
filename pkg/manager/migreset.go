package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/store"
)

// A MIG mode change that the driver leaves pending until a GPU reset (a
// vGPU host: the GPU's SR-IOV VFs are enabled) is carried through by
// vgpud, as NVIDIA's tools do it: once nothing on the GPU is in use, it
// lets go of its own NVML session on the GPU, disables the VFs (which by
// then parent nothing), resets the GPU, re-enables the VFs and opens its
// session again; the settings the reset lost (heterogeneous mode, the
// pinned scheduler) are put back after, in the driver's order
// (settings.go). Each step is recorded in an intent (store.OpMIGMode) and
// followed by a crash point: a restart finishes the sequence
// (resolveMIGMode). docs/operations.md, "MIG mode changes and GPU resets".

// GPUResetter is the host side of a GPU reset: the NVML session vgpud
// holds on a GPU (which the driver's reset and sriov-manage -d refuse
// while it is open), the GPU's SR-IOV VFs and the reset itself.
type GPUResetter interface {
	// Holders names the other processes holding an NVML session on the
	// GPU (vgpud's own is not named).
	Holders(ctx context.Context, gpuUUID string) ([]string, error)
	ReleaseGPU(ctx context.Context, gpuUUID string) error
	ReopenGPU(ctx context.Context, gpuUUID string) error
	// SetVFs is sriov-manage -e (on) or -d.
	SetVFs(ctx context.Context, gpuUUID string, on bool) error
	// ResetGPU resets the GPU as nvidia-smi -r does and returns when it is
	// back.
	ResetGPU(ctx context.Context, gpuUUID string) error
}

// Values of Config.GPUReset.
const (
	GPUResetAllow = "allow"
	GPUResetNever = "never"
)

// The steps of the sequence, as recorded in its intent (stored: never
// renamed).
const (
	migStepReleased = "released"
	migStepVFsOff   = "vfs-off"
	migStepReset    = "reset"
	migStepVFsOn    = "vfs-on"
)

// migPlan is the intent's payload.
type migPlan struct {
	GPU string `json:"gpu"`
	PCI string `json:"pci"`
	On  bool   `json:"on"`
	// VFs: the GPU's VFs were enabled when the sequence began.
	VFs bool `json:"vfs"`
}

// MIGResetSteps lists the steps vgpud takes to carry a MIG mode change on
// g through a reset (for a dry run), nil where it cannot or may not.
func (m *Manager) MIGResetSteps(g *gpu.GPU) []string {
	if !m.resetAllowed() {
		return nil
	}
	steps := []string{"release vgpud's NVML session on " + g.PCI}
	if g.VGPU.NumVFs > 0 {
		steps = append(steps, "disable its SR-IOV VFs")
	}
	steps = append(steps, "reset the GPU")
	if g.VGPU.NumVFs > 0 {
		steps = append(steps, "enable its SR-IOV VFs")
	}
	return append(steps, "open vgpud's NVML session again", "set heterogeneous mode and the pinned scheduler again")
}

func (m *Manager) resetAllowed() bool {
	return m.reset != nil && m.resetPolicy != GPUResetNever
}

// manualReset is the error of a change left pending for an operator.
func manualReset(g *gpu.GPU, err error, why string) error {
	return fail(ErrBusy, err, "MIG mode on GPU %s is pending until a GPU reset%s: stop the GPU's clients and disable its SR-IOV VFs (sriov-manage -d %s), then reset it (nvidia-smi -r -i %d)", g.PCI, why, g.PCI, g.Index)
}

// migResetBlockers names what holds g so that a reset would be refused
// and vgpud may not undo: a VM running a vGPU (vgpud's or not), vGPUs and
// mdevs no record explains (owned: the VFs and mdev UUIDs of vgpud's
// records, which the change's own destroys take first) and other
// processes' NVML sessions. "" when nothing does.
func (m *Manager) migResetBlockers(ctx context.Context, g *gpu.GPU, owned map[string]bool) string {
	var why []string
	for _, a := range g.VGPU.Active {
		why = append(why, fmt.Sprintf("VM %s runs a vGPU (type %d)", a.VMID, a.Type))
	}
	for _, vf := range g.VGPU.VFs {
		if vf.Type != 0 && !owned[vf.PCI] {
			why = append(why, fmt.Sprintf("VF %s holds a vGPU (type %d) vgpud did not create", vf.PCI, vf.Type))
		}
	}
	for _, md := range g.VGPU.Mdevs {
		if !owned[md.UUID] {
			why = append(why, fmt.Sprintf("mdev %s vgpud did not create", md.UUID))
		}
	}
	if m.reset != nil {
		hs, err := m.reset.Holders(ctx, g.UUID)
		if err != nil {
			why = append(why, fmt.Sprintf("its NVML clients cannot be read (%v)", err))
		} else if len(hs) > 0 {
			why = append(why, "NVML sessions are open by "+strings.Join(hs, ", "))
		}
	}
	return strings.Join(why, "; ")
}

// MIGResetPlan says what a MIG mode change of GPU id to on takes besides
// the driver's call, for a dry run and apply's pre-flight, from the GPU as
// last discovered: nil when no reset is expected (no VFs and no vGPU on
// the GPU, or the mode is already on) ; the steps vgpud will take to reset
// it; ErrBusy naming what outside vgpud holds the GPU (a running VM, a
// foreign vGPU or mdev, another NVML client), or with the manual procedure
// where vgpud may not reset GPUs. The GPU's vgpud instances are not
// counted: the caller destroys them first or refuses them itself.
func (m *Manager) MIGResetPlan(ctx context.Context, id string, on bool) ([]string, error) {
	g, err := m.gpuByAnyID(id)
	if err != nil {
		return nil, err
	}
	if !g.MIG.Capable || (g.MIG.Enabled == on && g.MIG.Pending == on) || (g.VGPU.NumVFs == 0 && !hostHoldsVGPUs(&g)) {
		return nil, nil
	}
	if !m.resetAllowed() {
		why := ""
		if m.reset != nil {
			why = " (gpuReset: never: vgpud resets no GPU)"
		}
		return nil, manualReset(&g, nil, why)
	}
	owned := map[string]bool{}
	if err := m.db.View(func(tx *store.Tx) error {
		s, err := m.snapshot(tx)
		for _, r := range s.byGPU[g.UUID] {
			owned[r.VF], owned[r.MdevUUID] = true, true
		}
		return err
	}); err != nil {
		return nil, classify(err, "read the records of GPU %s", g.PCI)
	}
	if why := m.migResetBlockers(ctx, &g, owned); why != "" {
		return nil, fail(ErrBusy, nil, "the MIG mode change of GPU %s needs a GPU reset, and something outside vgpud holds the GPU: %s", g.PCI, why)
	}
	return m.MIGResetSteps(&g), nil
}

// carryMIGReset runs the sequence on g, whose MIG mode change to on the
// driver left pending. Called with the GPU's lock held and no record on
// the GPU (admitModeChange).
func (m *Manager) carryMIGReset(ctx context.Context, g *gpu.GPU, on bool) error {
	plan := migPlan{GPU: g.UUID, PCI: g.PCI, On: on, VFs: g.VGPU.NumVFs > 0}
	// A struct of strings and bools always marshals.
	payload, _ := json.Marshal(plan)
	id := uuid.NewString()
	if err := m.db.Update(func(tx *store.Tx) error {
		return tx.PutIntent(store.Intent{ID: id, Op: store.OpMIGMode, Instance: g.UUID, Payload: payload, Started: m.now()})
	}); err != nil {
		return classify(err, "record the MIG mode change of GPU %s", g.PCI)
	}
	m.crash(CrashMIGIntent)
	m.log.Info("MIG mode change needs a GPU reset: vgpud carries it through", "gpu", g.PCI, "on", on, "steps", len(m.MIGResetSteps(g)))
	err := m.runMIGSteps(ctx, id, plan, nil)
	m.refreshGPU(ctx, g.UUID)
	if err != nil {
		return err
	}
	m.log.Info("MIG mode change carried through", "gpu", g.PCI, "on", on)
	return nil
}

// runMIGSteps takes the steps not in done, recording each. On a failure
// it puts the VFs and the session back and drops the intent: the mode
// stays pending, as the driver left it.
func (m *Manager) runMIGSteps(ctx context.Context, id string, p migPlan, done []string) error {
	step := func(name, point string, fn func() error) error {
		if slices.Contains(done, name) {
			return nil
		}
		m.log.Info("MIG mode change: step", "gpu", p.PCI, "step", name)
		if err := fn(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if err := m.db.Update(func(tx *store.Tx) error { return tx.AppendStep(id, name) }); err != nil {
			return fmt.Errorf("record step %s: %w", name, err)
		}
		done = append(done, name)
		m.emit(Event{Kind: EventGPUChanged, ID: p.GPU, Op: "mig-mode", Detail: fmt.Sprintf("GPU %s: MIG mode change: %s done", p.PCI, name)})
		m.crash(point)
		return nil
	}
	err := step(migStepReleased, CrashMIGRelease, func() error { return m.reset.ReleaseGPU(ctx, p.GPU) })
	if err == nil && p.VFs {
		err = step(migStepVFsOff, CrashMIGVFsOff, func() error { return m.reset.SetVFs(ctx, p.GPU, false) })
	}
	if err == nil {
		err = step(migStepReset, CrashMIGReset, func() error { return m.reset.ResetGPU(ctx, p.GPU) })
	}
	// Whatever happened, the VFs and the session come back.
	var undo []error
	if p.VFs && slices.Contains(done, migStepVFsOff) {
		if verr := step(migStepVFsOn, CrashMIGVFsOn, func() error { return m.reset.SetVFs(ctx, p.GPU, true) }); verr != nil {
			undo = append(undo, verr)
		}
	}
	if rerr := m.reset.ReopenGPU(ctx, p.GPU); rerr != nil {
		undo = append(undo, fmt.Errorf("reopen: %w", rerr))
	}
	if len(undo) > 0 {
		// The intent stays: the next reconcile tries again.
		return fail(ErrBackendFailure, errors.Join(append([]error{err}, undo...)...), "MIG mode change on GPU %s: the GPU could not be put back", p.PCI)
	}
	if derr := m.dropIntent(id); derr != nil {
		return classify(derr, "drop the MIG mode change's intent")
	}
	if err != nil {
		return fail(ErrBusy, err, "MIG mode on GPU %s is pending: the reset that commits it failed; the GPU is as before", p.PCI)
	}
	return nil
}

// settingsAfterReset sets again the settings of g the reset lost, as
// reconcile does, once the VFs are back (settings.go has the order).
func (m *Manager) settingsAfterReset(ctx context.Context, g *gpu.GPU) {
	m.admit.Lock()
	defer m.admit.Unlock()
	var rep ReconcileReport
	err := errors.Join(m.applyVGPUModes(ctx, &rep), m.applySchedulers(ctx, &rep))
	if err != nil || len(rep.Pending) > 0 {
		m.log.Warn("settings after the GPU reset", "gpu", g.PCI, "pending", rep.Pending, "err", err)
	}
}

// VFsDisabledByVgpud lists the GPUs (UUIDs) whose VFs a MIG mode change
// cut off by a crash left disabled: the start-up wait for the VFs must not
// wait for them, the start-up reconcile enables them.
func VFsDisabledByVgpud(db *store.DB) ([]string, error) {
	var its []store.Intent
	if err := db.View(func(tx *store.Tx) (err error) { its, err = tx.Intents(); return err }); err != nil {
		return nil, fmt.Errorf("read intents: %w", err)
	}
	var out []string
	for _, it := range its {
		if it.Op == store.OpMIGMode && slices.Contains(it.Steps, migStepVFsOff) && !slices.Contains(it.Steps, migStepVFsOn) {
			out = append(out, it.Instance)
		}
	}
	return out, nil
}

// resolveMIGMode finishes a sequence a crash cut off: the steps not
// recorded are taken (a reset not yet done is done, the VFs enabled
// again), then the settings the reset lost are set again. Called by
// reconcile under the admission lock.
func (m *Manager) resolveMIGMode(ctx context.Context, it store.Intent, rep *ReconcileReport) error {
	var p migPlan
	if err := json.Unmarshal(it.Payload, &p); err != nil || p.GPU == "" || m.reset == nil {
		m.log.Warn("MIG mode change intent cannot be resolved: dropped", "intent", it.ID, "err", err)
		return m.dropIntent(it.ID)
	}
	// A new process: its session on the GPU is open again.
	done := slices.DeleteFunc(slices.Clone(it.Steps), func(s string) bool { return s == migStepReleased })
	l := m.gpuLock(p.GPU)
	l.Lock()
	err := m.runMIGSteps(ctx, it.ID, p, done)
	l.Unlock()
	m.refreshGPU(ctx, p.GPU)
	if err != nil {
		rep.Pending = append(rep.Pending, Message(err))
		m.log.Warn("MIG mode change cut off by a restart: not finished", "gpu", p.PCI, "err", err)
		return nil
	}
	m.log.Info("MIG mode change cut off by a restart: finished", "gpu", p.PCI, "on", p.On)
	if g := m.hostGPU(p.GPU); !p.On && g != nil && !g.MIG.Enabled {
		m.dropPinsAfterMIGOff(*g)
	}
	if err := m.applyVGPUModes(ctx, rep); err != nil {
		return err
	}
	return m.applySchedulers(ctx, rep)
}
