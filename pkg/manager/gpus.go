package manager

import (
	"context"
	"errors"
	"sort"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/store"
)

// GPUView is one GPU with vgpud's view of it.
type GPUView struct {
	gpu.GPU
	// State is ok, lost, failed (an XID or fault) or passthrough.
	State string `json:"state"`
	// Reason says why a GPU is failed.
	Reason string `json:"reason,omitempty"`
	// Instances are the records on this GPU.
	Instances []string `json:"instances,omitempty"`
}

// GPUs lists the host's GPUs as last discovered.
func (m *Manager) GPUs() ([]GPUView, error) {
	var out []GPUView
	err := m.db.View(func(tx *store.Tx) error {
		s, err := m.snapshot(tx)
		if err != nil {
			return err
		}
		for i := range s.inv.GPUs {
			g := s.inv.GPUs[i]
			v := GPUView{GPU: g, State: "ok"}
			switch {
			case g.Lost:
				v.State = "lost"
			case s.failed[g.UUID] != "":
				v.State, v.Reason = "failed", s.failed[g.UUID]
			case s.passthroughOn(g.UUID) != nil:
				v.State = "passthrough"
			}
			for _, r := range s.byGPU[g.UUID] {
				v.Instances = append(v.Instances, r.UUID)
			}
			sort.Strings(v.Instances)
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
// instances live on the GPU. When the driver leaves the change pending the
// error is ErrBusy and says how to commit it.
func (m *Manager) SetMIGMode(ctx context.Context, id string, on bool) error {
	done, err := m.begin()
	if err != nil {
		return err
	}
	defer done()
	if why := m.Degraded(); why != "" {
		return fail(ErrBusy, nil, "carving is disabled: %s", why)
	}
	g, err := m.gpuByAnyID(id)
	if err != nil {
		return err
	}
	if !g.MIG.Capable {
		return fail(ErrInvalidArgument, nil, "GPU %s (%s) has no MIG", g.PCI, g.Model)
	}
	m.admit.Lock()
	defer m.admit.Unlock()
	var n int
	if err := m.db.View(func(tx *store.Tx) error {
		s, err := m.snapshot(tx)
		n = len(s.byGPU[g.UUID])
		return err
	}); err != nil {
		return classify(err, "set MIG mode")
	}
	if n > 0 {
		return fail(ErrBusy, nil, "GPU %s holds %d vgpud instances; destroy them before changing its MIG mode", g.PCI, n)
	}
	l := m.gpuLock(g.UUID)
	l.Lock()
	err = m.mig.SetMIGMode(ctx, g.UUID, on)
	l.Unlock()
	m.refreshGPU(ctx, g.UUID)
	m.emit(Event{Kind: EventGPUChanged, ID: g.UUID})
	if errors.Is(err, gpu.ErrResetRequired) {
		return fail(ErrBusy, err, "MIG mode on GPU %s is pending: stop the GPU's clients and disable its SR-IOV VFs (sriov-manage -d %s), then reset it (nvidia-smi -r -i %d)", g.PCI, g.PCI, g.Index)
	}
	if err != nil {
		return classify(err, "set MIG mode on GPU %s", g.PCI)
	}
	m.log.Info("MIG mode set", "gpu", g.PCI, "on", on)
	return nil
}

// SetHeterogeneous switches a GPU's time-sliced vGPUs between one type and
// mixed sizes; refused while vGPUs exist on it.
func (m *Manager) SetHeterogeneous(ctx context.Context, id string, on bool) error {
	g, err := m.gpuByAnyID(id)
	if err != nil {
		return err
	}
	l := m.gpuLock(g.UUID)
	l.Lock()
	err = m.mig.SetHeterogeneous(ctx, g.UUID, on)
	l.Unlock()
	m.refreshGPU(ctx, g.UUID)
	if err != nil {
		return classify(err, "set heterogeneous vGPU mode on GPU %s", g.PCI)
	}
	m.emit(Event{Kind: EventGPUChanged, ID: g.UUID})
	return nil
}

// MarkGPUFailed refuses new carving on a GPU (an XID, a fault); ""
// clears it. Its instances are reported with the GPU's state.
func (m *Manager) MarkGPUFailed(uuid, why string) {
	m.invMu.Lock()
	if why == "" {
		delete(m.failedGPUs, uuid)
	} else {
		m.failedGPUs[uuid] = why
	}
	m.invMu.Unlock()
	kind := EventGPUChanged
	if why != "" {
		kind = EventGPULost
	}
	m.emit(Event{Kind: kind, ID: uuid, Detail: why})
}
