package apply

import (
	"fmt"
	"strings"

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
//     destroys them first; a change set edited after a dry run may not);
//   - MIG goes off only on a GPU without GPU instances: the driver
//     refuses it (IN_USE) while one vgpud did not create is there, and
//     apply never touches those;
//   - a MIG mode change that needs a GPU reset (the GPU's VFs are
//     enabled) goes through only where the manager will carry the reset
//     through: not while a VM runs on the GPU or something else outside
//     vgpud holds it, nor with resets forbidden (gpuReset: never: the
//     manual procedure is the answer); the reset's steps are kept for the
//     dry run (host.resetSteps);
//   - a scheduler setting is one the driver takes: a known policy and a
//     time slice in the scheduler's range (gpu.ValidateTimeslice).
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
		if c.Op == OpSetScheduler && c.Scheduler != nil {
			if _, err := c.Scheduler.request(); err != nil {
				pr.add(manager.ErrInvalidArgument, "%s: GPU %s (%s): scheduler %v", c, g.PCI, g.Model, err)
				continue
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
		case c.Op == OpSetMIGMode && c.MIG != nil && !*c.MIG && len(foreignGIs(g, h.insts)) > 0:
			gis := foreignGIs(g, h.insts)
			pr.add(manager.ErrBusy, "%s: GPU %s (%s) holds %s vgpud did not create (%s), and the driver keeps MIG on while a GPU instance is there; "+
				"apply never touches them: destroy them with nvidia-smi mig -dci and -dgi first, or leave mig out of the layout",
				c, g.PCI, g.Model, plural(len(gis), "GPU instance"), strings.Join(gis, ", "))
		case c.Op == OpSetMIGMode && c.MIG != nil && h.migReset != nil:
			steps, err := h.migReset(g.UUID, *c.MIG)
			if err != nil {
				pr.add(manager.ErrBusy, "%s: %s", c, manager.Message(err))
				continue
			}
			h.resetSteps[g.UUID] = steps
		}
	}
}

// foreignGIs names the GPU instances on g that no vgpud record explains
// ("GI 3 (3g.40gb) at slices 0-3"): the driver holds MIG on while they
// exist.
func foreignGIs(g manager.GPUView, insts []manager.InstanceView) []string {
	owned := map[[2]int]bool{}
	for _, in := range insts {
		if in.GPUUUID == g.UUID {
			owned[[2]int{in.GIStart, in.GIProfileID}] = true
		}
	}
	var out []string
	for _, gi := range g.MIG.Instances {
		if owned[[2]int{gi.Placement.Start, gi.ProfileID}] {
			continue
		}
		name := gi.Profile
		if name == "" {
			name = fmt.Sprintf("profile id %d", gi.ProfileID)
		}
		out = append(out, fmt.Sprintf("GI %d (%s) at slices %d-%d", gi.ID, name, gi.Placement.Start, gi.Placement.End()-1))
	}
	return out
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
