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
		b.add("vgpud_instance_info", 1, i.UUID, i.Tenant, i.GPU, string(i.Kind), i.Profile, i.VM, i.State)
		b.add("vgpud_instance_framebuffer_total_bytes", float64(i.VRAMBytes), i.UUID, i.Tenant, i.GPU)
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
		b.add("vgpud_gpu_info", 1, g.UUID, g.PCI, g.Model, g.Product, strconv.FormatBool(g.MIG), g.Flavour)
		b.add("vgpud_gpu_lost", boolf(g.State == gpu.StateLost), g.UUID)
		b.add("vgpud_gpu_failed", boolf(g.State == gpu.StateFailed), g.UUID)
		b.add("vgpud_gpu_framebuffer_allocated_bytes", float64(alloc[g.UUID]), g.UUID)
		if !g.MIG {
			continue
		}
		for s := 0; s < g.MIGSlots; s++ {
			slot := strconv.Itoa(s)
			if i, ok := slots[g.UUID][s]; ok {
				b.add("vgpud_gpu_mig_slot_occupied", 1, g.UUID, slot, i.UUID, i.Tenant, i.Profile)
			} else {
				b.add("vgpud_gpu_mig_slot_occupied", 0, g.UUID, slot, "", "", "")
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
