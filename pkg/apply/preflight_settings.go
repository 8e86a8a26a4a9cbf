package apply

import (
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// checkGPUSettings refuses the MIG-mode and scheduler changes the manager
// would refuse at their step, so that a dry run says so and Execute stops
// before its first change instead of half-way:
//
//   - a GPU passed through whole (its passthrough instance stays) has no
//     vGPU scheduler to pin, and its MIG mode cannot change under it;
//   - a MIG mode changes only on a GPU without vgpud instances (Diff
//     destroys them first; a change set edited after a dry run may not).
//
// destroyed are the instances the change set destroys before these steps.
func checkGPUSettings(h *host, cs ChangeSet, destroyed map[string]bool, pr *problems) {
	for _, c := range cs.Changes {
		if c.Op != OpSetMIGMode && c.Op != OpSetScheduler {
			continue
		}
		g, ok := h.findGPU(gpuID(c))
		if !ok {
			pr.add(manager.ErrNotFound, "%s: no GPU %s on this host (run `vgpuctl gpus`)", c, gpuID(c))
			continue
		}
		var stay []manager.InstanceView
		var passthrough *manager.InstanceView
		for i, in := range h.insts {
			if in.GPUUUID != g.UUID || destroyed[in.UUID] || in.State == store.StateDestroying {
				continue
			}
			stay = append(stay, in)
			if in.Kind == store.KindPassthrough {
				passthrough = &h.insts[i]
			}
		}
		switch {
		case c.Op == OpSetScheduler && (c.Scheduler == nil || c.Scheduler.Mode == manager.SchedAdaptive):
			// Handing a GPU to the share loop only drops a pin: allowed.
		case passthrough != nil:
			pr.add(manager.ErrBusy, "%s: GPU %s (%s) is passed through whole (instance %s stays); destroy that instance first",
				c, g.PCI, g.Model, passthrough.UUID)
		case c.Op == OpSetMIGMode && len(stay) > 0:
			pr.add(manager.ErrBusy, "%s: GPU %s (%s) holds %d vgpud instances that stay; destroy them before changing its MIG mode",
				c, g.PCI, g.Model, len(stay))
		}
	}
}
