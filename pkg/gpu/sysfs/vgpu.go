package sysfs

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// --- vendor-specific VFIO (reference 2) ---

func vfAttr(vf, name string) string { return pciPath(vf) + "/nvidia/" + name }

// IsVFIO reports whether vf is a virtual function with the NVIDIA
// vendor-VFIO attributes.
func (s *Sysfs) IsVFIO(vf string) bool {
	_, err := s.fs.Stat(vfAttr(vf, "current_vgpu_type"))
	return err == nil
}

// VF reads one virtual function's vGPU state.
func (s *Sysfs) VF(bdf string) (gpu.VF, error) {
	v := gpu.VF{PCI: bdf, GPUInstance: -1, Placement: -1, IOMMUGroup: -1}
	if !s.IsVFIO(bdf) {
		return v, fmt.Errorf("%w: %s", ErrNotVFIO, bdf)
	}
	t, err := s.readInt(vfAttr(bdf, "current_vgpu_type"))
	if err != nil {
		return v, fmt.Errorf("read current_vgpu_type of %s: %w", bdf, err)
	}
	v.Type = t
	data, err := s.fs.ReadFile(vfAttr(bdf, "creatable_vgpu_types"))
	if err != nil {
		return v, fmt.Errorf("read creatable_vgpu_types of %s: %w", bdf, err)
	}
	types, err := ParseCreatable(data)
	if err != nil {
		return v, fmt.Errorf("%s: %w", bdf, err)
	}
	for _, c := range types {
		v.Creatable = append(v.Creatable, c.ID)
	}
	// ENXIO until a vGPU exists; "Not Applicable" where it has none.
	if n, err := s.readInt(vfAttr(bdf, "gpu_instance_id")); err == nil {
		v.GPUInstance = n
	}
	if n, err := s.readInt(vfAttr(bdf, "placement_id")); err == nil {
		v.Placement = n
	}
	if g, err := s.linkBase(pciPath(bdf) + "/iommu_group"); err == nil {
		v.IOMMUGroup, _ = strconv.Atoi(g)
	}
	return v, nil
}

// SetVFType writes a vGPU type id into the VF's current_vgpu_type. It is
// idempotent: a VF that already has typeID is left alone. A VF holding
// another type is gpu.ErrInUse (the driver's EPERM); a type the VF cannot create
// now is gpu.ErrNoResources (EIO).
func (s *Sysfs) SetVFType(bdf string, typeID int) error {
	if typeID <= 0 {
		return fmt.Errorf("set vGPU type of %s: type id %d must be positive (ClearVF clears)", bdf, typeID)
	}
	cur, err := s.readInt(vfAttr(bdf, "current_vgpu_type"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("set vGPU type of %s: %w", bdf, ErrNotVFIO)
		}
		return fmt.Errorf("set vGPU type of %s: %w", bdf, err)
	}
	if cur == typeID {
		return nil
	}
	if cur != 0 {
		return fmt.Errorf("set vGPU type %d on %s: it holds type %d: %w", typeID, bdf, cur, gpu.ErrInUse)
	}
	err = s.fs.WriteFile(vfAttr(bdf, "current_vgpu_type"), []byte(strconv.Itoa(typeID)+"\n"))
	switch errnoOf(err) {
	case 0:
		return nil
	case syscall.EIO:
		return fmt.Errorf("set vGPU type %d on %s: %w: %w", typeID, bdf, gpu.ErrNoResources, err)
	case syscall.EPERM:
		return fmt.Errorf("set vGPU type %d on %s: %w: %w", typeID, bdf, gpu.ErrInUse, err)
	default:
		return fmt.Errorf("set vGPU type %d on %s: %w", typeID, bdf, err)
	}
}

// ClearVF writes 0 to current_vgpu_type, destroying the vGPU. Idempotent:
// a VF without a vGPU is left alone. While a VM still holds the VF the
// driver refuses with EPERM: gpu.ErrInUse (callers retry once QEMU has exited).
func (s *Sysfs) ClearVF(bdf string) error {
	cur, err := s.readInt(vfAttr(bdf, "current_vgpu_type"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("clear vGPU of %s: %w", bdf, err)
	}
	if cur == 0 {
		return nil
	}
	err = s.fs.WriteFile(vfAttr(bdf, "current_vgpu_type"), []byte("0\n"))
	switch errnoOf(err) {
	case 0:
		return nil
	case syscall.EPERM, syscall.EBUSY:
		return fmt.Errorf("clear vGPU of %s: %w: %w", bdf, gpu.ErrInUse, err)
	default:
		return fmt.Errorf("clear vGPU of %s: %w", bdf, err)
	}
}

// SetParams writes vgpu_params of a VF or mdev device directory ("" clears);
// the driver drops the last byte written, so a newline always ends it.
func (s *Sysfs) setParams(attr, params string) error {
	if params == "" {
		params = " "
	}
	err := s.fs.WriteFile(attr, []byte(params+"\n"))
	if errnoOf(err) == syscall.EPERM {
		return fmt.Errorf("set vgpu_params: %w: %w", gpu.ErrInUse, err)
	}
	return err
}

// SetVFParams writes a VF's vgpu_params.
func (s *Sysfs) SetVFParams(bdf, params string) error {
	return s.setParams(vfAttr(bdf, "vgpu_params"), params)
}

// --- legacy mediated devices (reference 1) ---

// MdevParents lists /sys/class/mdev_bus (empty on vendor-VFIO hosts).
func (s *Sysfs) MdevParents() ([]string, error) {
	entries, err := s.fs.ReadDir("class/mdev_bus")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list mdev parents: %w", err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out, nil
}

func typesDir(parent string) string { return "class/mdev_bus/" + parent + "/mdev_supported_types" }

// MdevTypes reads a parent's mdev_supported_types.
func (s *Sysfs) MdevTypes(parent string) ([]gpu.MdevType, error) {
	entries, err := s.fs.ReadDir(typesDir(parent))
	if err != nil {
		return nil, fmt.Errorf("list mdev types of %s: %w", parent, err)
	}
	var out []gpu.MdevType
	for _, e := range entries {
		t, err := s.mdevType(parent, e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (s *Sysfs) mdevType(parent, dir string) (gpu.MdevType, error) {
	t := gpu.MdevType{Dir: dir}
	id, ok := strings.CutPrefix(dir, "nvidia-")
	n, err := strconv.Atoi(id)
	if !ok || err != nil {
		return t, fmt.Errorf("%w: mdev type directory %s of %s is not nvidia-<id>", ErrParse, dir, parent)
	}
	t.ID = n
	base := typesDir(parent) + "/" + dir
	if t.Name, err = s.readString(base + "/name"); err != nil {
		return t, fmt.Errorf("read %s/name: %w", base, err)
	}
	if t.Available, err = s.readInt(base + "/available_instances"); err != nil {
		return t, fmt.Errorf("read %s/available_instances: %w", base, err)
	}
	t.DeviceAPI, _ = s.readString(base + "/device_api")
	data, err := s.fs.ReadFile(base + "/description")
	if err != nil {
		return t, fmt.Errorf("read %s/description: %w", base, err)
	}
	d, err := ParseDescription(data)
	if err != nil {
		return t, fmt.Errorf("%s: %w", base, err)
	}
	t.NumHeads, t.FrameRateLimit, t.FramebufferMiB, t.MaxResolution, t.MaxInstance = d.NumHeads, d.FrameRateLimit, d.FramebufferMiB, d.MaxResolution, d.MaxInstance
	t.DescriptionUnknown = d.Unknown
	return t, nil
}

// Mdevs lists /sys/bus/mdev/devices with each device's parent and type.
func (s *Sysfs) Mdevs() ([]gpu.Mdev, error) {
	entries, err := s.fs.ReadDir("bus/mdev/devices")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list mdevs: %w", err)
	}
	var out []gpu.Mdev
	for _, e := range entries {
		m, err := s.Mdev(e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UUID < out[j].UUID })
	return out, nil
}

// Mdev reads one mediated device; a missing one is fs.ErrNotExist.
func (s *Sysfs) Mdev(uuid string) (gpu.Mdev, error) {
	m := gpu.Mdev{UUID: uuid, GPUInstance: -1}
	base := "bus/mdev/devices/" + uuid
	target, err := s.fs.Readlink(base)
	if err != nil {
		return m, fmt.Errorf("read mdev %s: %w", uuid, err)
	}
	m.Parent = path.Base(path.Dir(target))
	if m.TypeDir, err = s.linkBase(base + "/mdev_type"); err != nil {
		return m, fmt.Errorf("read mdev %s type: %w", uuid, err)
	}
	m.Type, _ = strconv.Atoi(strings.TrimPrefix(m.TypeDir, "nvidia-"))
	if n, err := s.readInt(base + "/nvidia/gpu_instance_id"); err == nil {
		m.GPUInstance = n
	}
	return m, nil
}

// CreateMdev writes uuid into parent's type create file. An mdev with this
// UUID that exists already, on any parent and of any type, is
// gpu.ErrExists naming where it is (the kernel's EEXIST): this call did not
// make it, so it is not the caller's, however much it looks like what
// was asked for; only the caller's own record of an earlier create can
// say it is theirs. EIO from the driver (no instances left, another type
// on the GPU) is gpu.ErrNoResources.
func (s *Sysfs) CreateMdev(parent string, typeID int, uuid string) error {
	if m, err := s.Mdev(strings.ToLower(uuid)); err == nil {
		return fmt.Errorf("create mdev %s: it exists on %s as nvidia-%d: %w", uuid, m.Parent, m.Type, gpu.ErrExists)
	}
	create := fmt.Sprintf("%s/nvidia-%d/create", typesDir(parent), typeID)
	if _, err := s.fs.Stat(path.Dir(create)); err != nil {
		return fmt.Errorf("create mdev %s on %s: %w: nvidia-%d", uuid, parent, ErrNoMdevType, typeID)
	}
	err := s.fs.WriteFile(create, []byte(uuid))
	switch errnoOf(err) {
	case 0:
		return nil
	case syscall.EIO, syscall.EUSERS:
		return fmt.Errorf("create mdev %s of nvidia-%d on %s: %w: %w", uuid, typeID, parent, gpu.ErrNoResources, err)
	case syscall.EEXIST:
		return fmt.Errorf("create mdev %s: an mdev with this UUID exists: %w: %w", uuid, gpu.ErrExists, err)
	default:
		return fmt.Errorf("create mdev %s of nvidia-%d on %s: %w", uuid, typeID, parent, err)
	}
}

// RemoveMdev writes 1 to the device's remove file. Idempotent: a missing
// mdev is success. EBUSY (a VM has it open) is gpu.ErrInUse.
func (s *Sysfs) RemoveMdev(uuid string) error {
	base := "bus/mdev/devices/" + uuid
	if _, err := s.fs.Stat(base); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	err := s.fs.WriteFile(base+"/remove", []byte("1\n"))
	switch errnoOf(err) {
	case 0:
		return nil
	case syscall.EBUSY, syscall.EPERM:
		return fmt.Errorf("remove mdev %s: %w: %w", uuid, gpu.ErrInUse, err)
	case syscall.ENODEV, syscall.ENOENT:
		return nil
	default:
		return fmt.Errorf("remove mdev %s: %w", uuid, err)
	}
}

// SetMdevParams writes an mdev's vgpu_params.
func (s *Sysfs) SetMdevParams(uuid, params string) error {
	return s.setParams("bus/mdev/devices/"+uuid+"/nvidia/vgpu_params", params)
}
