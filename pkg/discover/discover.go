// Package discover builds the host inventory from the two real backends:
// NVML for identity, MIG and vGPU types, sysfs for the PCI view, SR-IOV
// virtual functions and mediated devices. GPUs are joined by PCI address.
//
// It imports pkg/gpu and the sysfs backend's view type.
//
// Imports: pkg/gpu, pkg/gpu/sysfs.
package discover

import (
	"context"
	"fmt"
	"sort"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
)

// NVML is what discovery needs from the NVML backend.
type NVML interface {
	Driver(ctx context.Context) (gpu.DriverInfo, error)
	Devices(ctx context.Context) ([]gpu.GPU, error)
}

// Sysfs is what discovery needs from the sysfs backend.
type Sysfs interface {
	Discover(pf string) (sysfs.GPUView, error)
}

// Inventory discovers every GPU. Per-GPU problems are recorded in the
// GPU's Errors; an error return means discovery as a whole failed.
func Inventory(ctx context.Context, n NVML, s Sysfs) (gpu.Inventory, error) {
	var inv gpu.Inventory
	drv, err := n.Driver(ctx)
	if err != nil {
		return inv, err
	}
	inv.Driver = drv
	gpus, err := n.Devices(ctx)
	if err != nil {
		return inv, err
	}
	for i := range gpus {
		Merge(&gpus[i], s)
	}
	sort.Slice(gpus, func(i, j int) bool { return gpus[i].PCI < gpus[j].PCI })
	inv.GPUs = gpus
	return inv, nil
}

// Merge adds the sysfs view of g (by its PCI address) to g.
func Merge(g *gpu.GPU, s Sysfs) {
	if g.PCI == "" {
		return
	}
	v, err := s.Discover(g.PCI)
	if err != nil {
		g.Errors = append(g.Errors, fmt.Sprintf("sysfs: %v", err))
		return
	}
	for _, w := range v.Warnings {
		g.Errors = append(g.Errors, "sysfs: "+w)
	}
	g.KernelDriver = v.Device.Driver
	g.NUMANode = v.Device.NUMANode
	nv := g.VGPU
	g.VGPU = v.VGPU
	g.VGPU.Supported, g.VGPU.Creatable, g.VGPU.Active = nv.Supported, nv.Creatable, nv.Active
	g.VGPU.Heterogeneous = nv.Heterogeneous
	perGI := map[int]int{}
	for _, vf := range g.VGPU.VFs {
		if vf.Type != 0 && vf.GPUInstance >= 0 {
			perGI[vf.GPUInstance]++
		}
	}
	for _, m := range g.VGPU.Mdevs {
		if m.GPUInstance >= 0 {
			perGI[m.GPUInstance]++
		}
	}
	for i := range g.MIG.Instances {
		g.MIG.Instances[i].VGPUs = perGI[g.MIG.Instances[i].ID]
	}
}

// Host is a Discoverer over the two backends.
type Host struct {
	NVML interface {
		NVML
		Describe(ctx context.Context, uuid string) (gpu.GPU, error)
	}
	Sysfs Sysfs
}

// Inventory discovers every GPU.
func (h Host) Inventory(ctx context.Context) (gpu.Inventory, error) {
	return Inventory(ctx, h.NVML, h.Sysfs)
}

// GPU re-reads one GPU.
func (h Host) GPU(ctx context.Context, uuid string) (gpu.GPU, error) {
	g, err := h.NVML.Describe(ctx, uuid)
	if err != nil {
		return g, err
	}
	Merge(&g, h.Sysfs)
	return g, nil
}
