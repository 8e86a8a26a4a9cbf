package apply

import (
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
)

// checkValues refuses, before the first change, each change whose own
// values its step would refuse: Diff never makes such a change, but a
// change set edited or kept since its dry run may hold one, and Execute
// would otherwise stop at it after the destroys before it. The values of
// set-scheduler changes are checked with the GPU's settings
// (checkGPUSettings); here are the rest:
//
//   - an operation Execute does not know;
//   - a set-mig-mode without a mode, or MIG on for a GPU without MIG;
//   - a set-scheduler without a setting, or pinning one on a GPU that
//     has no time-sliced scheduler once the MIG modes changed (MIG on, no
//     vGPU manager);
//   - a define-tenant or update-tenant without settings or with settings
//     the manager refuses; an undefine of a tenant that is not there;
//   - a create of a profile the GPU's model does not offer;
//   - a set-gpu-instance-scheduler without a valid setting, or for a GPU
//     without per-GPU-instance schedulers, MIG off after the changes, or
//     a profile that is no MIG-backed vGPU type (sched_gi.go).
//
// modes are the MIG modes the change set sets, by GPU UUID.
func checkValues(h *host, cs ChangeSet, modes map[string]bool, pr *problems) {
	defined := map[string]bool{}
	for _, c := range cs.Changes {
		if c.Op == OpDefineTenant || c.Op == OpUpdateTenant {
			defined[c.Tenant] = true
		}
	}
	for _, c := range cs.Changes {
		switch c.Op {
		case OpDestroy:
		case OpSetMIGMode:
			g, ok := h.findGPU(gpuID(c))
			switch {
			case c.MIG == nil:
				pr.add(manager.ErrInvalidArgument, "%s: the change sets no mode", c)
			case ok && *c.MIG && !g.MIG.Capable:
				pr.add(manager.ErrInvalidArgument, "%s: GPU %s (%s) has no MIG", c, g.PCI, g.Model)
			}
		case OpSetScheduler:
			g, ok := h.findGPU(gpuID(c))
			if c.Scheduler == nil {
				pr.add(manager.ErrInvalidArgument, "%s: the change sets no scheduler", c)
				continue
			}
			if !ok || c.Scheduler.Mode == manager.SchedAdaptive {
				continue
			}
			mig := g.MIG.Enabled
			if on, set := modes[g.UUID]; set {
				mig = on
			}
			if mig || g.VGPU.Flavour == "" || g.VGPU.Flavour == gpu.FlavourNone {
				pr.add(manager.ErrInvalidArgument, "%s: GPU %s (%s) has no time-sliced vGPU scheduler (MIG on, or no vGPU manager)", c, g.PCI, g.Model)
			}
		case OpDefineTenant, OpUpdateTenant:
			if c.Settings == nil {
				pr.add(manager.ErrInvalidArgument, "%s: the change gives the tenant no settings", c)
				continue
			}
			if err := c.Settings.tenant(c.Tenant).Validate(); err != nil {
				pr.add(manager.ErrInvalidArgument, "%s: %v", c, err)
			}
		case OpUndefineTenant:
			if _, ok := h.tenants[c.Tenant]; !ok && !defined[c.Tenant] {
				pr.add(manager.ErrNotFound, "%s: no tenant %s on this host", c, c.Tenant)
			}
		case OpCreate:
			g, ok := h.findGPU(gpuID(c))
			if !ok {
				continue // the GPU is checked with the creates' room
			}
			if _, why, ok := h.resolve(g.Model, c.Profile); !ok {
				pr.add(manager.ErrInvalidArgument, "%s: GPU %s: %s", c, g.PCI, why)
			}
		case OpSetGPUInstanceScheduler:
			checkGPUInstanceScheduler(h, c, modes, pr)
		default:
			pr.add(manager.ErrInvalidArgument, "change %q: unknown operation (want %s, %s, %s, %s, %s, %s, %s or %s)", c.Op,
				OpDestroy, OpSetMIGMode, OpSetScheduler, OpDefineTenant, OpUpdateTenant, OpUndefineTenant, OpCreate, OpSetGPUInstanceScheduler)
		}
	}
}
