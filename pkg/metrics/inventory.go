package metrics

import (
	"strconv"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/share"
)

// collectInventory emits what the manager's records say: GPUs, instances,
// tenants, allocations and the MIG slot map.
func (c *Collector) collectInventory(b *batch, inv share.Inventory) {
	alloc := map[string]uint64{}
	tenantFB := map[string]uint64{}
	tenantN := map[string]int{}
	slots := map[string]map[int]share.Instance{}
	for _, i := range inv.Instances {
		alloc[i.GPU] += i.VRAMBytes
		tenantFB[i.Tenant] += i.VRAMBytes
		tenantN[i.Tenant]++
		giID, giProfile := "", ""
		if i.Kind == share.MIG && i.GI >= 0 {
			giID = strconv.Itoa(i.GI)
			if i.RecordKind == "" || i.RecordKind == "mig" {
				// A MIG-backed vGPU's profile is its vGPU type, not
				// the GPU instance's profile DCGM names.
				giProfile = i.Profile
			}
		}
		b.add("vgpud_instance_info", 1, i.UUID, i.Tenant, b.gpus[i.GPU].index, i.GPU, b.gpus[i.GPU].pciBusID,
			giID, giProfile, instanceKind(i), i.Profile, i.VM, i.State)
		b.add("vgpud_instance_framebuffer_total_bytes", float64(i.VRAMBytes), b.inst(i.UUID, i.Tenant, i.GPU)...)
		if i.Kind == share.MIG && i.GIStart >= 0 && i.GISize > 0 {
			if slots[i.GPU] == nil {
				slots[i.GPU] = map[int]share.Instance{}
			}
			for s := i.GIStart; s < i.GIStart+i.GISize; s++ {
				if _, taken := slots[i.GPU][s]; !taken {
					slots[i.GPU][s] = i
				}
			}
		}
	}
	for _, g := range inv.GPUs {
		c.observed.touchGPU(g.UUID)
		b.add("vgpud_gpu_info", 1, b.gpu(g.UUID, g.Model, g.Product, strconv.FormatBool(g.MIG), g.Flavour)...)
		b.add("vgpud_gpu_lost", boolf(g.State == gpu.StateLost), b.gpu(g.UUID)...)
		b.add("vgpud_gpu_failed", boolf(g.State == gpu.StateFailed), b.gpu(g.UUID)...)
		b.add("vgpud_gpu_framebuffer_allocated_bytes", float64(alloc[g.UUID]), b.gpu(g.UUID)...)
		for _, s := range g.GPUInstanceSchedulers {
			giID := strconv.Itoa(s.GI)
			if !s.Pinned {
				b.add("vgpud_gpu_instance_scheduler_info", 1, b.gpu(g.UUID, giID, s.Profile, "adaptive", "")...)
				continue
			}
			b.add("vgpud_gpu_instance_scheduler_info", 1, b.gpu(g.UUID, giID, s.Profile, "pinned", string(s.Policy))...)
			b.add("vgpud_gpu_instance_scheduler_timeslice_seconds", s.Timeslice.Seconds(), b.gpu(g.UUID, giID)...)
			b.add("vgpud_gpu_instance_scheduler_pending", boolf(s.Pending), b.gpu(g.UUID, giID)...)
		}
		if !g.MIG {
			continue
		}
		for s := 0; s < g.MIGSlots; s++ {
			slot := strconv.Itoa(s)
			if i, ok := slots[g.UUID][s]; ok {
				b.add("vgpud_gpu_mig_slot_occupied", 1, b.gpu(g.UUID, slot, i.UUID, i.Tenant, i.Profile)...)
			} else {
				b.add("vgpud_gpu_mig_slot_occupied", 0, b.gpu(g.UUID, slot, "", "", "")...)
			}
		}
	}
	for _, t := range inv.Tenants {
		class := "best-effort"
		if t.Guaranteed {
			class = "guaranteed"
		}
		b.add("vgpud_tenant_info", 1, t.Name, class)
		b.add("vgpud_tenant_instances", float64(tenantN[t.Name]), t.Name)
		b.add("vgpud_tenant_framebuffer_allocated_bytes", float64(tenantFB[t.Name]), t.Name)
	}
}

// instanceKind is the instance's kind as vgpuctl and the D-Bus API name
// it: mig, mig-vgpu, vgpu (time-sliced) or passthrough.
func instanceKind(i share.Instance) string {
	if i.RecordKind != "" {
		return i.RecordKind
	}
	if i.Kind == share.TimeSliced {
		return "vgpu"
	}
	return string(i.Kind)
}
