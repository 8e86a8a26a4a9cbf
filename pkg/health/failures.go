package health

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlbackend "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/manager"
)

// failure is a GPU the watcher marked failed.
type failure struct {
	why   string
	since time.Time
	// lost: the GPU stopped answering (fell off the bus, removed); it is
	// back when it answers again.
	lost bool
	// reset: its PCI function was added or bound to its driver again
	// since it failed, which is how a reset shows in sysfs.
	reset bool
}

// noticeLost marks the GPUs discovery found lost that no event reported.
// A GPU that was lost before vgpud started has no name NVML can give (it
// answers nothing, and this process never saw it healthy): it is counted,
// and the host is re-read on every probe until it is back.
func (w *Watcher) noticeLost(reconciled bool) {
	unnamed := 0
	for _, g := range w.mgr.Inventory().GPUs {
		switch {
		case !g.Lost:
		case g.UUID == "":
			unnamed++
		case w.failed[g.UUID] == nil:
			w.fail(g, "GPU is lost: NVML answers GPU_IS_LOST (fell off the bus)", true)
			if !reconciled {
				w.ask(reconcile, "GPU lost")
			}
		}
	}
	if unnamed > w.unnamedLost {
		w.log.Error("GPU lost before vgpud started: NVML cannot say which; its instances read lost, and the host is re-read until it is back",
			"lost", unnamed)
		w.stats.Failures.Add(int64(unnamed - w.unnamedLost))
	}
	w.unnamedLost = unnamed
}

// onXID handles one NVML event.
func (w *Watcher) onXID(ctx context.Context, x nvmlbackend.Event) {
	if x.Type&gonvml.EventMigConfigChange != 0 {
		w.ask(reconcile, "MIG configuration changed")
		return
	}
	g := gpu.GPU{UUID: x.GPU, PCI: x.PCI}
	if x.GPU == "" {
		g = w.identifyLost(ctx)
		if g.UUID == "" && !x.IsXID() {
			w.log.Debug("a lost GPU was reported that is already followed")
			return
		}
	}
	if x.IsXID() {
		w.stats.XIDs.Add(1)
		// Metrics count XIDs from this event; Detail is the bare number.
		w.mgr.Publish(manager.Event{Kind: manager.EventXID, ID: g.UUID, Detail: strconv.FormatUint(x.XID, 10)})
	}
	lost := x.Lost || x.XID == 79 || x.Type&gonvml.EventTypeGpuUnavailableError != 0
	var why string
	switch {
	case x.IsXID() && (w.settings().CriticalXIDs[x.XID] || lost):
		why = xidText(x.XID)
	case x.Type&gonvml.EventTypeDoubleBitEccError != 0:
		why = "double-bit ECC error"
	case lost:
		why = "GPU is lost: NVML answers GPU_IS_LOST (fell off the bus)"
	}
	log := w.log.With("gpu", g.PCI, "uuid", g.UUID, "xid", x.XID, "gpu_instance", x.GPUInstance)
	if why == "" {
		log.Info("XID reported; the GPU stays in service", "what", xidText(x.XID))
		return
	}
	if g.UUID == "" {
		log.Error("critical error from a GPU NVML cannot name; re-reading the host", "what", why)
		w.ask(reconcile, why)
		return
	}
	if x.GPUInstance >= 0 {
		why += fmt.Sprintf(" on GPU instance %d", x.GPUInstance)
	}
	w.fail(g, why, lost)
	w.ask(reconcile, why)
}

// identifyLost re-reads the host to find which GPU an unnamed event came
// from: the one GPU that is lost now and was not before.
func (w *Watcher) identifyLost(ctx context.Context) gpu.GPU {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	w.stats.Refreshes.Add(1)
	if err := w.mgr.Refresh(ctx); err != nil {
		w.log.Warn("re-read the host", "err", err)
		return gpu.GPU{}
	}
	var found []gpu.GPU
	for _, g := range w.mgr.Inventory().GPUs {
		if g.Lost && w.failed[g.UUID] == nil {
			found = append(found, g)
		}
	}
	if len(found) == 1 {
		return found[0]
	}
	return gpu.GPU{}
}

// fail marks a GPU failed (once per reason) and says which instances it
// takes down with it.
func (w *Watcher) fail(g gpu.GPU, why string, lost bool) {
	f := w.failed[g.UUID]
	if f == nil {
		f = &failure{since: w.now()}
		w.failed[g.UUID] = f
		w.stats.Failures.Add(1)
	}
	f.lost = f.lost || lost
	f.reset = false
	if _, marked := w.mgr.FailedGPUs()[g.UUID]; f.why == why && marked {
		return
	}
	f.why = why
	if !lost {
		why += "; reset the GPU (stop its VMs, then nvidia-smi -r) to return it to service"
	}
	if f.lost {
		w.mgr.MarkGPULost(g.UUID, why)
	} else {
		w.mgr.MarkGPUFailed(g.UUID, why)
	}
	var insts []string
	if views, err := w.mgr.GPUs(); err == nil {
		for _, v := range views {
			if v.UUID == g.UUID {
				insts = v.Instances
			}
		}
	}
	w.log.Error("GPU failed: new carving there is refused", "gpu", g.PCI, "uuid", g.UUID, "why", why, "lost", f.lost, "instances", insts)
}

// probe re-reads each failed GPU and returns those that are back.
func (w *Watcher) probe(ctx context.Context) {
	marked := w.mgr.FailedGPUs()
	for u, f := range w.failed {
		if _, ok := marked[u]; !ok && !f.lost {
			delete(w.failed, u) // an operator cleared it (ClearGPU)
		}
	}
	if len(w.failed) == 0 && w.unnamedLost == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if w.unnamedLost > 0 {
		w.probeUnnamed(ctx)
	}
	uuids := make([]string, 0, len(w.failed))
	for u := range w.failed {
		uuids = append(uuids, u)
	}
	sort.Strings(uuids)
	for _, u := range uuids {
		f := w.failed[u]
		w.stats.Probes.Add(1)
		g, err := w.gpus.GPU(ctx, u)
		if err != nil || g.Lost {
			f.lost = true
			continue
		}
		if !f.lost && !f.reset {
			continue // an XID on a GPU that still answers: back only after a reset
		}
		w.recover(ctx, g, f)
	}
}

// probeUnnamed re-reads the host for the lost GPUs NVML cannot name.
func (w *Watcher) probeUnnamed(ctx context.Context) {
	w.stats.Probes.Add(1)
	before := w.unnamedLost
	if err := w.mgr.Refresh(ctx); err != nil {
		w.log.Debug("re-read the host", "err", err)
		return
	}
	w.noticeLost(true)
	if w.unnamedLost >= before {
		return
	}
	w.stats.Recoveries.Add(int64(before - w.unnamedLost))
	w.stats.Reconciles.Add(1)
	rep, err := w.mgr.Reconcile(ctx)
	if err != nil {
		w.log.Warn("lost GPU back, reconcile failed; instances are restored at the next reconcile", "err", err)
	} else {
		w.log.Info("lost GPU back in service", "recreated", len(rep.Recreated), "failed", len(rep.Failed))
	}
	w.reindex()
	w.restartXIDWatch()
	w.status()
}

// recover clears a GPU that came back and reconciles, which re-creates
// the instances it lost.
func (w *Watcher) recover(ctx context.Context, g gpu.GPU, f *failure) {
	delete(w.failed, g.UUID)
	w.mgr.MarkGPUFailed(g.UUID, "")
	w.stats.Recoveries.Add(1)
	w.stats.Reconciles.Add(1)
	rep, err := w.mgr.Reconcile(ctx)
	if err != nil {
		w.log.Warn("GPU back, reconcile failed; instances are restored at the next reconcile", "gpu", g.PCI, "err", err)
	} else {
		w.log.Info("GPU back in service", "gpu", g.PCI, "uuid", g.UUID, "was", f.why, "down", w.now().Sub(f.since).Round(time.Millisecond),
			"recreated", len(rep.Recreated), "failed", len(rep.Failed))
	}
	w.reindex()
	w.restartXIDWatch()
	w.status()
}
