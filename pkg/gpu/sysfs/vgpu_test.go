package sysfs_test

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

func setup(t *testing.T) (*sim.Host, *sysfs.Sysfs, *profile.Catalog) {
	t.Helper()
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	h, err := sim.Open(t.TempDir(), nil, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h, sysfs.New(h.FS()), cat
}

func typeID(t *testing.T, cat *profile.Catalog, model, name string) int {
	m, _ := cat.Model(model)
	vt, ok := m.VGPUTypeByName(name)
	if !ok {
		t.Fatalf("no %s", name)
	}
	return vt.ID
}

func TestVFLifecycle(t *testing.T) {
	h, s, cat := setup(t)
	pf, err := s.Device(sim.DefaultL4)
	if err != nil {
		t.Fatal(err)
	}
	if pf.Vendor != 0x10de || pf.Device != 0x27b8 || pf.Driver != "nvidia" || len(pf.VFs) != pf.TotalVFs || pf.TotalVFs == 0 {
		t.Fatalf("PF %+v", pf)
	}
	vf := pf.VFs[0]
	q4 := typeID(t, cat, "L4-24GB", "L4-4Q")
	if err := s.SetVFType(vf, q4); err != nil {
		t.Fatal(err)
	}
	if err := s.SetVFType(vf, q4); err != nil {
		t.Fatalf("second identical set is idempotent: %v", err)
	}
	if err := s.SetVFType(vf, typeID(t, cat, "L4-24GB", "L4-8Q")); !errors.Is(err, gpu.ErrInUse) {
		t.Fatalf("other type on a busy VF: %v, want ErrInUse", err)
	}
	if err := s.SetVFType(pf.VFs[1], typeID(t, cat, "L4-24GB", "L4-8Q")); !errors.Is(err, gpu.ErrNoResources) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("homogeneous conflict: %v, want ErrNoResources wrapping EIO", err)
	}
	info, err := s.VF(vf)
	if err != nil || info.Type != q4 || len(info.Creatable) != 0 {
		t.Fatalf("VF %+v, %v", info, err)
	}
	if err := h.OpenDevice(vf, "5f1c0a24-8c4d-4c53-9b2e-4f1b1f7a0001", "vm1"); err != nil {
		t.Fatal(err)
	}
	if err := s.ClearVF(vf); !errors.Is(err, gpu.ErrInUse) || !errors.Is(err, syscall.EPERM) {
		t.Fatalf("clear while held: %v, want ErrInUse wrapping EPERM", err)
	}
	if err := h.CloseDevice(vf); err != nil {
		t.Fatal(err)
	}
	if err := s.ClearVF(vf); err != nil {
		t.Fatal(err)
	}
	if err := s.ClearVF(vf); err != nil {
		t.Fatalf("second clear is idempotent: %v", err)
	}
	if err := s.SetVFParams(vf, "enable_uvm=1"); err != nil {
		t.Fatal(err)
	}
}

func TestMdevLifecycle(t *testing.T) {
	_, s, cat := setup(t)
	parents, err := s.MdevParents()
	if err != nil || len(parents) == 0 {
		t.Fatalf("parents %v, %v", parents, err)
	}
	types, err := s.MdevTypes(parents[0])
	if err != nil || len(types) == 0 || types[0].DeviceAPI != "vfio-pci" || types[0].FramebufferMiB == 0 {
		t.Fatalf("types %+v, %v", types, err)
	}
	q4 := typeID(t, cat, "A10-24GB", "A10-4Q")
	const u = "4b20d080-1b54-4048-85b3-a6a62d165c01"
	if err := s.CreateMdev(parents[0], q4, u); err != nil {
		t.Fatal(err)
	}
	// An mdev that exists is never the caller's, not even with the same
	// parent and type: the call did not make it (the kernel's EEXIST).
	for _, c := range []struct {
		parent string
		uuid   string
	}{{parents[0], u}, {parents[1], u}, {parents[0], strings.ToUpper(u)}} {
		err := s.CreateMdev(c.parent, q4, c.uuid)
		if !errors.Is(err, gpu.ErrExists) || !strings.Contains(err.Error(), "exists on "+parents[0]) {
			t.Fatalf("create %s on %s again: %v, want ErrExists saying where it is", c.uuid, c.parent, err)
		}
	}
	if err := s.CreateMdev(parents[0], 99999, "4b20d080-1b54-4048-85b3-a6a62d165c02"); !errors.Is(err, sysfs.ErrNoMdevType) {
		t.Fatalf("unknown type: %v", err)
	}
	m, err := s.Mdev(u)
	if err != nil || m.Parent != parents[0] || m.Type != q4 {
		t.Fatalf("mdev %+v, %v", m, err)
	}
	if err := s.RemoveMdev(u); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveMdev(u); err != nil {
		t.Fatalf("second remove is idempotent: %v", err)
	}
	if _, err := s.Device("0000:ff:00.0"); !errors.Is(err, sysfs.ErrNoDevice) {
		t.Fatalf("missing device: %v", err)
	}
}
