package sim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/profile"
)

// entry is one node of the rendered sysfs tree.
type entry struct {
	kind byte // 'f' file, 'd' dir, 'l' symlink
	data string
	// errno, when set, is what a read of this attribute fails with.
	errno syscall.Errno
}

// devDir is a device's canonical directory under the sysfs root.
func devDir(pci string) string {
	dom := "0000"
	if i := strings.Index(pci, ":"); i > 0 {
		dom = pci[:i]
	}
	return "devices/pci" + dom + ":00/" + pci
}

// globalEntries are the directories every GPU shares.
func (h *Host) globalEntries(out map[string]entry) {
	st := h.st
	dir := func(p string) { out[p] = entry{kind: 'd'} }
	for _, p := range []string{"bus", "bus/pci", "bus/pci/devices", "bus/pci/drivers", "bus/pci/drivers/nvidia",
		"kernel", "kernel/iommu_groups", "devices", "class"} {
		dir(p)
	}
	anyMdev := false
	for _, g := range st.GPUs {
		anyMdev = anyMdev || (st.DriverLoaded && g.Flavour == string(gpu.FlavourMdev))
		dir(filepath.Dir(devDir(g.PCI)))
	}
	if anyMdev {
		for _, p := range []string{"class/mdev_bus", "bus/mdev", "bus/mdev/devices", "bus/mdev/drivers", "bus/mdev/drivers/nvidia-vgpu-vfio"} {
			dir(p)
		}
	}
}

// gpuEntries are one GPU's devices (PF, VFs, mdevs) and the links to them.
func (h *Host) gpuEntries(g *gpuState, out map[string]entry) {
	st := h.st
	dir := func(p string) { out[p] = entry{kind: 'd'} }
	file := func(p, data string) { out[p] = entry{kind: 'f', data: data} }
	link := func(p, target string) { out[p] = entry{kind: 'l', data: target} }
	errFile := func(p string, e syscall.Errno) { out[p] = entry{kind: 'f', errno: e} }
	pciDev := func(pci, devID string, group int) string {
		d := devDir(pci)
		dir(d)
		file(d+"/vendor", "0x10de\n")
		file(d+"/device", devID+"\n")
		file(d+"/subsystem_vendor", "0x10de\n")
		file(d+"/subsystem_device", "0x16c1\n")
		file(d+"/class", "0x030200\n")
		if st.DriverLoaded {
			link(d+"/driver", "../../../bus/pci/drivers/nvidia")
		}
		link(d+"/iommu_group", fmt.Sprintf("../../../kernel/iommu_groups/%d", group))
		dir(fmt.Sprintf("kernel/iommu_groups/%d", group))
		link("bus/pci/devices/"+pci, "../../../"+d)
		return d
	}
	devID := strings.ToLower(g.model.PCIDeviceIDs[0])
	pf := pciDev(g.PCI, devID, g.IOMMUGroup)
	file(pf+"/numa_node", fmt.Sprintf("%d\n", g.NUMANode))
	if g.model.VGPU != nil && g.model.VGPU.SRIOVVFs > 0 {
		file(pf+"/sriov_totalvfs", fmt.Sprintf("%d\n", g.model.VGPU.SRIOVVFs))
		file(pf+"/sriov_numvfs", fmt.Sprintf("%d\n", len(g.VFs)))
		file(pf+"/sriov_offset", "4\n")
		file(pf+"/sriov_stride", "1\n")
	}
	if !st.DriverLoaded {
		return
	}
	creatable := creatableTypes(g, st.Spec.Options)
	for n, v := range g.VFs {
		link(fmt.Sprintf("%s/virtfn%d", pf, n), "../"+v.PCI)
		d := pciDev(v.PCI, devID, v.IOMMUGroup)
		link(d+"/physfn", "../"+g.PCI)
		file(d+"/numa_node", fmt.Sprintf("%d\n", g.NUMANode))
		if g.Flavour != string(gpu.FlavourVFIO) {
			continue
		}
		dir(d + "/nvidia")
		file(d+"/nvidia/creatable_vgpu_types", creatableFile(g, v, creatable))
		cur, params := 0, v.Params
		if v.VGPU != nil {
			cur, params = v.VGPU.Type, v.VGPU.Params
		}
		file(d+"/nvidia/current_vgpu_type", fmt.Sprintf("%d\n", cur))
		file(d+"/nvidia/vgpu_params", params+"\n")
		renderGIFiles(d, v.VGPU, file, errFile)
	}
	roomOf := map[int]int{}
	for i := range g.model.VGPU.Types {
		if g.Flavour == string(gpu.FlavourMdev) {
			t := &g.model.VGPU.Types[i]
			roomOf[t.ID] = room(g, t, st.Spec.Options)
		}
	}
	for _, parent := range g.mdevParents() {
		pd := devDir(parent)
		link("class/mdev_bus/"+parent, "../../"+pd)
		dir(pd + "/mdev_supported_types")
		for i := range g.model.VGPU.Types {
			t := &g.model.VGPU.Types[i]
			if !g.model.HasFlow(t, string(gpu.FlavourMdev)) {
				continue
			}
			td := fmt.Sprintf("%s/mdev_supported_types/nvidia-%d", pd, t.ID)
			dir(td)
			file(td+"/name", "NVIDIA "+t.Name+"\n")
			file(td+"/description", description(t))
			file(td+"/available_instances", fmt.Sprintf("%d\n", availableFrom(g, parent, roomOf[t.ID])))
			file(td+"/device_api", "vfio-pci\n")
			errFile(td+"/create", syscall.EIO)
			dir(td + "/devices")
		}
	}
	for _, m := range g.Mdevs {
		pd := devDir(m.Parent)
		md := pd + "/" + m.UUID
		dir(md)
		link(md+"/mdev_type", fmt.Sprintf("../mdev_supported_types/nvidia-%d", m.VGPU.Type))
		link(fmt.Sprintf("%s/mdev_supported_types/nvidia-%d/devices/%s", pd, m.VGPU.Type, m.UUID), "../../../"+m.UUID)
		errFile(md+"/remove", syscall.EIO)
		link(md+"/iommu_group", fmt.Sprintf("../../../../kernel/iommu_groups/%d", m.IOMMUGroup))
		dir(fmt.Sprintf("kernel/iommu_groups/%d", m.IOMMUGroup))
		link(md+"/driver", "../../../../bus/mdev/drivers/nvidia-vgpu-vfio")
		link(md+"/subsystem", "../../../../bus/mdev")
		dir(md + "/nvidia")
		file(md+"/nvidia/vgpu_params", m.VGPU.Params+"\n")
		file(md+"/nvidia/vm_name", m.VGPU.VMName+"\n")
		renderGIFiles(md, m.VGPU, file, errFile)
		link("bus/mdev/devices/"+m.UUID, "../../../"+md)
	}
}

// renderGIFiles writes nvidia/gpu_instance_id and nvidia/placement_id:
// ENXIO while no vGPU exists, "Not Applicable" where the vGPU has none.
func renderGIFiles(d string, v *vgpu, file func(p, data string), errFile func(string, syscall.Errno)) {
	if v == nil {
		errFile(d+"/nvidia/gpu_instance_id", syscall.ENXIO)
		errFile(d+"/nvidia/placement_id", syscall.ENXIO)
		return
	}
	gi, pl := "Not Applicable\n", "Not Applicable\n"
	if v.GI >= 0 {
		gi = fmt.Sprintf("%d\n", v.GI)
	}
	if v.Placement >= 0 {
		pl = fmt.Sprintf("%d\n", v.Placement)
	}
	file(d+"/nvidia/gpu_instance_id", gi)
	file(d+"/nvidia/placement_id", pl)
}

// creatableFile is nvidia/creatable_vgpu_types of a VF (reference 2.3):
// a header, then "%-5d : %s" per type the VF can create now; only the
// header once the VF has a vGPU or nothing fits.
func creatableFile(g *gpuState, v *vf, creatable []*profile.VGPUType) string {
	var b strings.Builder
	b.WriteString("ID    : vGPU Name\n")
	if v.VGPU != nil || g.Lost {
		return b.String()
	}
	for _, t := range creatable {
		fmt.Fprintf(&b, "%-5d : NVIDIA %s\n", t.ID, t.Name)
	}
	return b.String()
}

// description is an mdev type's description file (reference 1.2).
func description(t *profile.VGPUType) string {
	heads, frl, res := t.Display()
	return fmt.Sprintf("num_heads=%d, frl_config=%d, framebuffer=%dM, max_resolution=%s, max_instance=%d\n",
		heads, frl, t.FramebufferMiB, res, t.MaxInstances)
}

// mirrorMarker records, in the mirror, the state generation it shows.
const mirrorMarker = ".generation"

// writeMirror brings the on-disk mirror to the tree: a full rewrite when
// what is on disk is unknown (unless its marker shows this generation),
// else only the entries that changed.
func (h *Host) writeMirror() error {
	if !h.mirror {
		return nil
	}
	want := h.tree.entries
	root := h.SysRoot()
	marker := filepath.Join(root, mirrorMarker)
	gen := fmt.Sprintf("%d\n", h.st.Generation)
	if h.rendered == nil {
		if b, err := os.ReadFile(marker); err == nil && string(b) == gen {
			h.rendered = want
			return nil
		}
		if err := os.RemoveAll(root); err != nil {
			return fmt.Errorf("reset simulated sysfs mirror: %w", err)
		}
		if err := os.MkdirAll(root, 0o755); err != nil {
			return fmt.Errorf("create simulated sysfs mirror: %w", err)
		}
		h.rendered = map[string]entry{}
	}
	var gone []string
	for p := range h.rendered {
		if _, ok := want[p]; !ok {
			gone = append(gone, p)
		}
	}
	sort.Slice(gone, func(i, j int) bool { return len(gone[i]) > len(gone[j]) })
	for _, p := range gone {
		if err := os.RemoveAll(filepath.Join(root, p)); err != nil {
			return fmt.Errorf("write simulated sysfs mirror: %w", err)
		}
		delete(h.rendered, p)
	}
	paths := make([]string, 0, len(want))
	for p, e := range want {
		if old, ok := h.rendered[p]; !ok || old != e {
			paths = append(paths, p)
		}
	}
	sort.Slice(paths, func(i, j int) bool {
		return len(paths[i]) < len(paths[j]) || (len(paths[i]) == len(paths[j]) && paths[i] < paths[j])
	})
	for _, p := range paths {
		e := want[p]
		full := filepath.Join(root, p)
		if old, ok := h.rendered[p]; ok && old.kind != e.kind {
			if err := os.RemoveAll(full); err != nil {
				return fmt.Errorf("write simulated sysfs mirror: %w", err)
			}
		}
		var err error
		switch e.kind {
		case 'd':
			err = os.MkdirAll(full, 0o755)
		case 'f':
			err = os.WriteFile(full, []byte(e.data), 0o644)
		case 'l':
			_ = os.Remove(full)
			if err = os.MkdirAll(filepath.Dir(full), 0o755); err == nil {
				err = os.Symlink(e.data, full)
			}
		}
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("write simulated sysfs mirror %s: %w", p, err)
		}
		h.rendered[p] = e
	}
	return os.WriteFile(marker, []byte(gen), 0o644)
}
