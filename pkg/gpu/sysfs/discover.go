package sysfs

import (
	"context"
	"fmt"
	"strings"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// GPUView is what sysfs shows of one physical GPU.
type GPUView struct {
	Device PCIDevice
	VGPU   gpu.VGPU
	// Warnings are problems that did not stop the read (an mdevctl
	// definition that does not parse).
	Warnings []string
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
		v.Warnings = s.markMdevctl(v.VGPU.Mdevs)
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

// markMdevctl sets each mdev's mdevctl definition (same UUID, parent and
// type), when WithMdevctl gave the directory. A definition of the UUID
// for another parent or type does not describe this mdev: it is reported.
// So is an entry of the directory that was skipped (MdevctlFileError),
// and on the mdev it names, MdevctlProblem says why.
func (s *Sysfs) markMdevctl(mdevs []gpu.Mdev) []string {
	if s.mdevctl == "" || len(mdevs) == 0 {
		return nil
	}
	defs, err := s.readMdevctl()
	var warn []string
	if err != nil {
		warn = append(warn, err.Error())
	}
	byUUID := map[string]gpu.MdevctlDefinition{}
	for _, d := range defs {
		byUUID[d.UUID] = d
	}
	bad := map[string]string{}
	for _, fe := range MdevctlFileErrors(err) {
		bad[fe.UUID] = fe.Error()
	}
	for i := range mdevs {
		u := strings.ToLower(mdevs[i].UUID)
		if why, ok := bad[u]; ok {
			mdevs[i].MdevctlProblem = why
		}
		d, ok := byUUID[u]
		if !ok {
			continue
		}
		if d.Parent != mdevs[i].Parent || d.Type != mdevs[i].TypeDir {
			warn = append(warn, fmt.Sprintf("mdevctl defines %s as %s on %s, but it is %s on %s", d.UUID, d.Type, d.Parent, mdevs[i].TypeDir, mdevs[i].Parent))
			continue
		}
		mdevs[i].Mdevctl = &d
	}
	return warn
}

// readMdevctl reads the directory (ReadMdevctl), starting no read while
// one that outlived its deadline is still blocked: a file system that
// does not answer holds one goroutine, not one per discovery.
func (s *Sysfs) readMdevctl() ([]gpu.MdevctlDefinition, error) {
	s.mdevctlMu.Lock()
	stuck := s.mdevctlStuck
	s.mdevctlMu.Unlock()
	if stuck > 0 {
		return nil, fmt.Errorf("mdevctl definitions in %s: %w: an earlier read has not returned yet", s.mdevctl, ErrMdevctlTimeout)
	}
	step := func(n int) func() {
		return func() {
			s.mdevctlMu.Lock()
			s.mdevctlStuck += n
			s.mdevctlMu.Unlock()
		}
	}
	return readMdevctl(context.Background(), s.mdevctl, step(1), step(-1))
}
