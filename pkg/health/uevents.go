package health

import (
	"fmt"
	"strings"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/uevent"
)

// devRef is what a PCI address is to vgpud.
type devRef struct {
	uuid string
	pf   bool
}

// reindex maps every PCI address of the host's GPUs to its GPU.
func (w *Watcher) reindex() {
	idx := map[string]devRef{}
	for _, g := range w.mgr.Inventory().GPUs {
		if g.PCI == "" {
			continue
		}
		idx[g.PCI] = devRef{uuid: g.UUID, pf: true}
		for _, vf := range g.VGPU.VFs {
			idx[vf.PCI] = devRef{uuid: g.UUID}
		}
		for _, p := range g.VGPU.MdevParents {
			if _, ok := idx[p.PCI]; !ok {
				idx[p.PCI] = devRef{uuid: g.UUID}
			}
		}
	}
	// A failed GPU keeps its entries: its PCI functions may be gone from
	// discovery, and their return is what the index must recognise.
	for pci, r := range w.index {
		if _, ok := idx[pci]; !ok && w.failed[r.uuid] != nil {
			idx[pci] = r
		}
	}
	w.index = idx
}

// onUevent decides what a uevent asks for.
func (w *Watcher) onUevent(ev uevent.Event) {
	name := ev.Name()
	switch ev.Subsystem {
	case "mdev":
		w.stats.Relevant.Add(1)
		if ev.Action == uevent.Remove {
			w.ask(reconcile, "mdev removed")
		} else {
			w.ask(refresh, "mdev "+string(ev.Action))
		}
		return
	case "pci":
	default:
		return
	}
	ref, known := w.index[name]
	if !known && !strings.HasPrefix(strings.ToUpper(ev.Env["PCI_ID"]), "10DE:") {
		return // not an NVIDIA function
	}
	w.stats.Relevant.Add(1)
	if known && ref.pf {
		switch ev.Action {
		case uevent.Remove, uevent.Unbind:
			w.fail(w.gpuOf(ref.uuid, name), fmt.Sprintf("PCI function %s %s (removed from the bus or unbound from its driver)", name, pastTense(ev.Action)), true)
			w.ask(reconcile, "GPU "+string(ev.Action))
		case uevent.Add, uevent.Bind:
			if f := w.failed[ref.uuid]; f != nil {
				f.reset = true
				w.log.Info("failed GPU re-appeared on the bus; checking it", "gpu", name, "action", ev.Action)
			}
			w.ask(reconcile, "GPU "+string(ev.Action))
		default:
			w.ask(refresh, "GPU "+string(ev.Action))
		}
		return
	}
	switch {
	case ev.Action == uevent.Change && ev.Env["NVIDIA_VGPU_TYPE"] != "0":
		w.ask(refresh, "VF vGPU type set")
	case ev.Action == uevent.Change:
		w.ask(reconcile, "VF vGPU type cleared")
	case !known && (ev.Action == uevent.Add || ev.Action == uevent.Bind):
		w.ask(reconcile, "NVIDIA PCI function appeared")
	default:
		w.ask(reconcile, "VF "+string(ev.Action))
	}
}

func pastTense(a uevent.Action) string {
	switch a {
	case uevent.Remove:
		return "removed"
	case uevent.Unbind:
		return "unbound"
	}
	return string(a)
}

// gpuOf returns the inventory's GPU, or one with just the identity.
func (w *Watcher) gpuOf(uuid, pci string) gpu.GPU {
	for _, g := range w.mgr.Inventory().GPUs {
		if g.UUID == uuid {
			return g
		}
	}
	return gpu.GPU{UUID: uuid, PCI: pci}
}
