package sysfs

import (
	"fmt"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// GPUView is what sysfs shows of one physical GPU.
type GPUView struct {
	Device PCIDevice
	VGPU   gpu.VGPU
}

// Discover reads a physical function, its virtual functions, the mdev
// parents among them and their mediated devices. The flavour is decided
// per GPU from what sysfs shows: an mdev_bus entry for the PF or a VF means
// legacy mdev; VFs with nvidia/current_vgpu_type mean vendor VFIO.
func (s *Sysfs) Discover(pf string) (GPUView, error) {
	var v GPUView
	d, err := s.Device(pf)
	if err != nil {
		return v, err
	}
	v.Device = d
	v.VGPU.Flavour = gpu.FlavourNone
	v.VGPU.TotalVFs, v.VGPU.NumVFs = d.TotalVFs, d.NumVFs

	parents, err := s.MdevParents()
	if err != nil {
		return v, err
	}
	mine := map[string]bool{pf: true}
	for _, vf := range d.VFs {
		mine[vf] = true
	}
	for _, p := range parents {
		if !mine[p] {
			continue
		}
		types, err := s.MdevTypes(p)
		if err != nil {
			return v, err
		}
		v.VGPU.MdevParents = append(v.VGPU.MdevParents, gpu.MdevParent{PCI: p, Types: types})
	}
	if len(v.VGPU.MdevParents) > 0 {
		v.VGPU.Flavour = gpu.FlavourMdev
		mdevs, err := s.Mdevs()
		if err != nil {
			return v, err
		}
		for _, m := range mdevs {
			if mine[m.Parent] {
				v.VGPU.Mdevs = append(v.VGPU.Mdevs, m)
			}
		}
	}
	for _, vf := range d.VFs {
		if !s.IsVFIO(vf) {
			continue
		}
		info, err := s.VF(vf)
		if err != nil {
			return v, fmt.Errorf("GPU %s: %w", pf, err)
		}
		v.VGPU.VFs = append(v.VGPU.VFs, info)
	}
	if len(v.VGPU.VFs) > 0 && v.VGPU.Flavour == gpu.FlavourNone {
		v.VGPU.Flavour = gpu.FlavourVFIO
	}
	return v, nil
}
