package sim_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

func catalog(t testing.TB) *profile.Catalog {
	t.Helper()
	c, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type env struct {
	h   *sim.Host
	lib nvml.Interface
	fs  *sim.FS
	cat *profile.Catalog
}

func newEnv(t testing.TB, spec *sim.Spec) *env {
	t.Helper()
	cat := catalog(t)
	h, err := sim.Open(t.TempDir(), spec, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	lib := h.NVML()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	return &env{h: h, lib: lib, fs: h.FS(), cat: cat}
}

func (e *env) dev(t testing.TB, pci string) nvml.Device {
	t.Helper()
	d, ret := e.lib.DeviceGetHandleByPciBusId(pci)
	if ret != nvml.SUCCESS {
		t.Fatalf("device %s: %v", pci, ret)
	}
	return d
}

func giInfo(t testing.TB, d nvml.Device, profileIndex int) nvml.GpuInstanceProfileInfo {
	t.Helper()
	info, ret := d.GetGpuInstanceProfileInfo(profileIndex)
	if ret != nvml.SUCCESS {
		t.Fatalf("GetGpuInstanceProfileInfo(%d): %v", profileIndex, ret)
	}
	return info
}

func createGI(t testing.TB, d nvml.Device, profileIndex, start int) (nvml.GpuInstance, nvml.Return) {
	t.Helper()
	info := giInfo(t, d, profileIndex)
	pls, ret := d.GetGpuInstancePossiblePlacements(&info)
	if ret != nvml.SUCCESS {
		t.Fatalf("placements: %v", ret)
	}
	pl := nvml.GpuInstancePlacement{Start: uint32(start), Size: pls[0].Size}
	return d.CreateGpuInstanceWithPlacement(&info, &pl)
}

func mustGI(t testing.TB, d nvml.Device, profileIndex, start int) nvml.GpuInstance {
	t.Helper()
	gi, ret := createGI(t, d, profileIndex, start)
	if ret != nvml.SUCCESS {
		t.Fatalf("create GI profile index %d at %d: %v", profileIndex, start, ret)
	}
	return gi
}

// graphics is the engine whose vGPU scheduler the _v2 calls address.
const graphics = uint32(nvml.VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS)

// H100 NVML profile indexes (reference 3.1).
const (
	p1g   = nvml.GPU_INSTANCE_PROFILE_1_SLICE
	p1gme = nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1
	p2g   = nvml.GPU_INSTANCE_PROFILE_2_SLICE
	p3g   = nvml.GPU_INSTANCE_PROFILE_3_SLICE
	p4g   = nvml.GPU_INSTANCE_PROFILE_4_SLICE
	p7g   = nvml.GPU_INSTANCE_PROFILE_7_SLICE
)

func TestNVMLRefusals(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, e *env) nvml.Return
		want nvml.Return
	}{
		{"GI with MIG off", func(t *testing.T, e *env) nvml.Return {
			_, r := createGI(t, e.dev(t, sim.DefaultH100TS), p3g, 0)
			return r
		}, nvml.ERROR_NOT_SUPPORTED},
		{"GI at an illegal start", func(t *testing.T, e *env) nvml.Return {
			_, r := createGI(t, e.dev(t, sim.DefaultH100MIG), p3g, 2)
			return r
		}, nvml.ERROR_INVALID_ARGUMENT},
		{"GI overlapping another", func(t *testing.T, e *env) nvml.Return {
			d := e.dev(t, sim.DefaultH100MIG)
			mustGI(t, d, p3g, 0)
			_, r := createGI(t, d, p2g, 2)
			return r
		}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"GI profile count exhausted (+me)", func(t *testing.T, e *env) nvml.Return {
			d := e.dev(t, sim.DefaultH100MIG)
			mustGI(t, d, p1gme, 0)
			_, r := createGI(t, d, p1gme, 3)
			return r
		}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"GI at an illegal start with the profile's count exhausted", func(t *testing.T, e *env) nvml.Return {
			d := e.dev(t, sim.DefaultH100MIG)
			mustGI(t, d, p4g, 0)
			_, r := createGI(t, d, p4g, 4)
			return r
		}, nvml.ERROR_INVALID_ARGUMENT},
		{"GI 4g after 3g at 4 (only start 0)", func(t *testing.T, e *env) nvml.Return {
			d := e.dev(t, sim.DefaultH100MIG)
			mustGI(t, d, p1g, 0)
			_, r := createGI(t, d, p4g, 0)
			return r
		}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"GI without placement when full", func(t *testing.T, e *env) nvml.Return {
			d := e.dev(t, sim.DefaultH100MIG)
			mustGI(t, d, p7g, 0)
			info := giInfo(t, d, p1g)
			_, r := d.CreateGpuInstance(&info)
			return r
		}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"profile index out of range", func(t *testing.T, e *env) nvml.Return {
			_, r := e.dev(t, sim.DefaultH100MIG).GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_COUNT)
			return r
		}, nvml.ERROR_INVALID_ARGUMENT},
		{"profile absent on this GPU (8-slice on H100)", func(t *testing.T, e *env) nvml.Return {
			_, r := e.dev(t, sim.DefaultH100MIG).GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_8_SLICE)
			return r
		}, nvml.ERROR_NOT_SUPPORTED},
		{"MIG query on a non-MIG GPU", func(t *testing.T, e *env) nvml.Return {
			_, _, r := e.dev(t, sim.DefaultL4).GetMigMode()
			return r
		}, nvml.ERROR_NOT_SUPPORTED},
		{"destroy GI with a compute instance", func(t *testing.T, e *env) nvml.Return {
			gi := mustGI(t, e.dev(t, sim.DefaultH100MIG), p3g, 4)
			ci, r := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
			if r != nvml.SUCCESS {
				t.Fatal(r)
			}
			if _, r := gi.CreateComputeInstance(&ci); r != nvml.SUCCESS {
				t.Fatal(r)
			}
			return gi.Destroy()
		}, nvml.ERROR_IN_USE},
		{"second full compute instance", func(t *testing.T, e *env) nvml.Return {
			gi := mustGI(t, e.dev(t, sim.DefaultH100MIG), p3g, 4)
			ci, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
			if _, r := gi.CreateComputeInstance(&ci); r != nvml.SUCCESS {
				t.Fatal(r)
			}
			_, r := gi.CreateComputeInstance(&ci)
			return r
		}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"CI profile larger than the GI", func(t *testing.T, e *env) nvml.Return {
			gi := mustGI(t, e.dev(t, sim.DefaultH100MIG), p2g, 0)
			_, r := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
			return r
		}, nvml.ERROR_NOT_SUPPORTED},
		{"destroy GI with a MIG-backed vGPU", func(t *testing.T, e *env) nvml.Return {
			gi := mustGI(t, e.dev(t, sim.DefaultH100MIG), p3g, 0)
			writeOK(t, e, vfType(h100MIGVF(0)), typeID(t, e, "H100-SXM5-80GB", "H100XM-3-40C"))
			return gi.Destroy()
		}, nvml.ERROR_IN_USE},
		{"stale GI handle after destroy", func(t *testing.T, e *env) nvml.Return {
			gi := mustGI(t, e.dev(t, sim.DefaultH100MIG), p3g, 0)
			if r := gi.Destroy(); r != nvml.SUCCESS {
				t.Fatal(r)
			}
			_, r := gi.GetInfo()
			return r
		}, nvml.ERROR_INVALID_ARGUMENT},
		{"disable MIG with GPU instances", func(t *testing.T, e *env) nvml.Return {
			d := e.dev(t, sim.DefaultH100MIG)
			mustGI(t, d, p1g, 0)
			_, r := d.SetMigMode(nvml.DEVICE_MIG_DISABLE)
			return r
		}, nvml.ERROR_IN_USE},
		{"MIG mode on a non-MIG GPU", func(t *testing.T, e *env) nvml.Return {
			_, r := e.dev(t, sim.DefaultL4).SetMigMode(nvml.DEVICE_MIG_ENABLE)
			return r
		}, nvml.ERROR_NOT_SUPPORTED},
		{"MIG mode out of range", func(t *testing.T, e *env) nvml.Return {
			_, r := e.dev(t, sim.DefaultH100MIG).SetMigMode(7)
			return r
		}, nvml.ERROR_INVALID_ARGUMENT},
		{"heterogeneous mode with MIG on", func(t *testing.T, e *env) nvml.Return {
			return e.dev(t, sim.DefaultH100MIG).SetVgpuHeterogeneousMode(hetMode(1))
		}, nvml.ERROR_NOT_SUPPORTED},
		{"heterogeneous mode with a vGPU", func(t *testing.T, e *env) nvml.Return {
			writeOK(t, e, vfType(vfOf(sim.DefaultL4, 0)), typeID(t, e, "L4-24GB", "L4-4Q"))
			return e.dev(t, sim.DefaultL4).SetVgpuHeterogeneousMode(hetMode(1))
		}, nvml.ERROR_IN_USE},
		{"heterogeneous mode, wrong struct version", func(t *testing.T, e *env) nvml.Return {
			return e.dev(t, sim.DefaultL4).SetVgpuHeterogeneousMode(nvml.VgpuHeterogeneousMode{Version: 1, Mode: 1})
		}, nvml.ERROR_ARGUMENT_VERSION_MISMATCH},
		{"scheduler under MIG", func(t *testing.T, e *env) nvml.Return {
			_, r := e.dev(t, sim.DefaultH100MIG).GetVgpuSchedulerState_v2(nvml.VgpuSchedulerStateInfo_v2{EngineId: graphics})
			return r
		}, nvml.ERROR_NOT_SUPPORTED},
		{"scheduler log under MIG", func(t *testing.T, e *env) nvml.Return {
			_, r := e.dev(t, sim.DefaultH100MIG).GetVgpuSchedulerLog_v2(nvml.VgpuSchedulerLogInfo_v2{EngineId: graphics})
			return r
		}, nvml.ERROR_NOT_SUPPORTED},
		{"scheduler set while a VM runs a vGPU", func(t *testing.T, e *env) nvml.Return {
			writeOK(t, e, vfType(vfOf(sim.DefaultL4, 0)), typeID(t, e, "L4-24GB", "L4-4Q"))
			if err := e.h.OpenDevice(vfOf(sim.DefaultL4, 0), "5f1c0a24-8c4d-4c53-9b2e-4f1b1f7a0001", "vm1"); err != nil {
				t.Fatal(err)
			}
			return e.dev(t, sim.DefaultL4).SetVgpuSchedulerState_v2(&nvml.VgpuSchedulerState_v2{EngineId: graphics, SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE})
		}, nvml.ERROR_NOT_SUPPORTED},
		{"scheduler policy unknown", func(t *testing.T, e *env) nvml.Return {
			return e.dev(t, sim.DefaultL4).SetVgpuSchedulerState_v2(&nvml.VgpuSchedulerState_v2{EngineId: graphics, SchedulerPolicy: 9})
		}, nvml.ERROR_INVALID_ARGUMENT},
		{"scheduler set without a state", func(t *testing.T, e *env) nvml.Return {
			return e.dev(t, sim.DefaultL4).SetVgpuSchedulerState_v2(nil)
		}, nvml.ERROR_INVALID_ARGUMENT},
		{"scheduler engine that is none", func(t *testing.T, e *env) nvml.Return {
			_, r := e.dev(t, sim.DefaultL4).GetVgpuSchedulerState_v2(nvml.VgpuSchedulerStateInfo_v2{EngineId: 0})
			return r
		}, nvml.ERROR_INVALID_ARGUMENT},
		{"scheduler of an NVENC engine", func(t *testing.T, e *env) nvml.Return {
			return e.dev(t, sim.DefaultL4).SetVgpuSchedulerState_v2(&nvml.VgpuSchedulerState_v2{EngineId: nvml.VGPU_SCHEDULER_ENGINE_TYPE_NVENC0, SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE})
		}, nvml.ERROR_NOT_SUPPORTED},
		{"scheduler frequency over ARR's", func(t *testing.T, e *env) nvml.Return {
			return e.dev(t, sim.DefaultL4).SetVgpuSchedulerState_v2(&nvml.VgpuSchedulerState_v2{EngineId: graphics, SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE, Frequency: 5000})
		}, nvml.ERROR_INVALID_ARGUMENT},
		{"scheduler time slice (1 s / frequency) over the longest", func(t *testing.T, e *env) nvml.Return {
			return e.dev(t, sim.DefaultL4).SetVgpuSchedulerState_v2(&nvml.VgpuSchedulerState_v2{EngineId: graphics, SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE, Frequency: 10})
		}, nvml.ERROR_INVALID_ARGUMENT},
		{"scheduler average factor out of range", func(t *testing.T, e *env) nvml.Return {
			return e.dev(t, sim.DefaultL4).SetVgpuSchedulerState_v2(&nvml.VgpuSchedulerState_v2{EngineId: graphics, SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE, AvgFactor: 61, Frequency: 100})
		}, nvml.ERROR_INVALID_ARGUMENT},
		{"max instances of a type not on this GPU", func(t *testing.T, e *env) nvml.Return {
			types, r := e.dev(t, sim.DefaultL4).GetSupportedVgpus()
			if r != nvml.SUCCESS {
				t.Fatal(r)
			}
			_, r = types[0].GetMaxInstances(e.dev(t, sim.DefaultA10))
			return r
		}, nvml.ERROR_INVALID_ARGUMENT},
		{"lost GPU", func(t *testing.T, e *env) nvml.Return {
			if err := e.h.LoseGPU(sim.DefaultL4); err != nil {
				t.Fatal(err)
			}
			_, r := e.dev(t, sim.DefaultL4).GetUUID()
			return r
		}, nvml.ERROR_GPU_IS_LOST},
		{"unknown UUID", func(t *testing.T, e *env) nvml.Return {
			_, r := e.lib.DeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
			return r
		}, nvml.ERROR_NOT_FOUND},
		{"injected fault, once", func(t *testing.T, e *env) nvml.Return {
			if err := e.h.AddFault(sim.Fault{Op: "CreateGpuInstanceWithPlacement", Return: int(nvml.ERROR_UNKNOWN), Count: 1}); err != nil {
				t.Fatal(err)
			}
			d := e.dev(t, sim.DefaultH100MIG)
			if _, r := createGI(t, d, p1g, 0); r != nvml.ERROR_UNKNOWN {
				t.Fatalf("first call: %v, want ERROR_UNKNOWN", r)
			}
			_, r := createGI(t, d, p1g, 0)
			return r
		}, nvml.SUCCESS},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, nil)
			if got := c.run(t, e); got != c.want {
				t.Fatalf("got %v (%d), want %v (%d)", got, got, c.want, c.want)
			}
		})
	}
}

func hetMode(m uint32) nvml.VgpuHeterogeneousMode {
	v := nvml.VgpuHeterogeneousMode{Mode: m}
	v.Version = nvml.STRUCT_VERSION(v, 1)
	return v
}

func TestNVMLUninitialized(t *testing.T) {
	h, err := sim.Open(t.TempDir(), nil, catalog(t), sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lib := h.NVML()
	if _, r := lib.DeviceGetCount(); r != nvml.ERROR_UNINITIALIZED {
		t.Fatalf("before Init: %v, want ERROR_UNINITIALIZED", r)
	}
	if err := h.SetDriverLoaded(false); err != nil {
		t.Fatal(err)
	}
	if r := lib.Init(); r != nvml.ERROR_LIBRARY_NOT_FOUND {
		t.Fatalf("Init without driver: %v, want ERROR_LIBRARY_NOT_FOUND", r)
	}
	if err := h.SetDriverLoaded(true); err != nil {
		t.Fatal(err)
	}
	if r := lib.Init(); r != nvml.SUCCESS {
		t.Fatalf("Init with driver: %v", r)
	}
	if n, r := lib.DeviceGetCount(); r != nvml.SUCCESS || n != 4 {
		t.Fatalf("DeviceGetCount = %d, %v; want 4", n, r)
	}
}

func TestMIGModePendingWhileVFsEnabled(t *testing.T) {
	e := newEnv(t, nil)
	d := e.dev(t, sim.DefaultH100TS)
	act, r := d.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	if r != nvml.SUCCESS || act != nvml.ERROR_IN_USE {
		t.Fatalf("SetMigMode = activation %v, ret %v; want IN_USE, SUCCESS", act, r)
	}
	cur, pend, _ := d.GetMigMode()
	if cur != nvml.DEVICE_MIG_DISABLE || pend != nvml.DEVICE_MIG_ENABLE {
		t.Fatalf("mode = %d/%d, want current 0, pending 1", cur, pend)
	}
	// The reset that a reboot implies commits it.
	if err := e.h.Reboot(); err != nil {
		t.Fatal(err)
	}
	if cur, _, _ := d.GetMigMode(); cur != nvml.DEVICE_MIG_ENABLE {
		t.Fatalf("after reboot current = %d, want 1", cur)
	}
}

// --- sysfs ---

func vfOf(pf string, n int) string {
	// VFs start at function 4 of the PF's device (offset 4, stride 1).
	bus := pf[:8]
	rid := 4 + n
	return bus + twoHex(rid>>3) + "." + string(rune('0'+rid&7))
}

func twoHex(n int) string {
	const h = "0123456789abcdef"
	return string([]byte{h[n>>4], h[n&15]})
}

func h100MIGVF(n int) string { return vfOf(sim.DefaultH100MIG, n) }

func vfType(vf string) string { return "bus/pci/devices/" + vf + "/nvidia/current_vgpu_type" }

func typeID(t testing.TB, e *env, model, name string) int {
	t.Helper()
	m, _ := e.cat.Model(model)
	vt, ok := m.VGPUTypeByName(name)
	if !ok {
		t.Fatalf("no type %s on %s", name, model)
	}
	return vt.ID
}

func itoa(n int) string { return strings.TrimSpace(strings.Repeat(" ", 0) + formatInt(n)) }

func formatInt(n int) string {
	if n == 0 {
		return "0"
	}
	s := ""
	for n > 0 {
		s = string(rune('0'+n%10)) + s
		n /= 10
	}
	return s
}

func write(e *env, path, data string) error { return e.fs.WriteFile(path, []byte(data)) }

func writeOK(t testing.TB, e *env, path string, id int) {
	t.Helper()
	if err := write(e, path, itoa(id)+"\n"); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}

func mdevCreate(e *env, parent string, id int, uuid string) error {
	return write(e, "class/mdev_bus/"+parent+"/mdev_supported_types/nvidia-"+itoa(id)+"/create", uuid)
}

const (
	uuid1 = "4b20d080-1b54-4048-85b3-a6a62d165c01"
	uuid2 = "4b20d080-1b54-4048-85b3-a6a62d165c02"
)

func TestSysfsRefusals(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, e *env) error
		want syscall.Errno
	}{
		{"current_vgpu_type not a number", func(t *testing.T, e *env) error {
			return write(e, vfType(vfOf(sim.DefaultL4, 0)), "L4-4Q\n")
		}, syscall.EINVAL},
		{"clear an idle VF", func(t *testing.T, e *env) error {
			return write(e, vfType(vfOf(sim.DefaultL4, 0)), "0\n")
		}, syscall.EPERM},
		{"type on a VF that has one", func(t *testing.T, e *env) error {
			writeOK(t, e, vfType(vfOf(sim.DefaultL4, 0)), typeID(t, e, "L4-24GB", "L4-4Q"))
			return write(e, vfType(vfOf(sim.DefaultL4, 0)), itoa(typeID(t, e, "L4-24GB", "L4-4Q")))
		}, syscall.EPERM},
		{"homogeneous: second type on the GPU", func(t *testing.T, e *env) error {
			writeOK(t, e, vfType(vfOf(sim.DefaultL4, 0)), typeID(t, e, "L4-24GB", "L4-4Q"))
			return write(e, vfType(vfOf(sim.DefaultL4, 1)), itoa(typeID(t, e, "L4-24GB", "L4-8Q")))
		}, syscall.EIO},
		{"max instances exhausted", func(t *testing.T, e *env) error {
			writeOK(t, e, vfType(vfOf(sim.DefaultL4, 0)), typeID(t, e, "L4-24GB", "L4-24Q"))
			return write(e, vfType(vfOf(sim.DefaultL4, 1)), itoa(typeID(t, e, "L4-24GB", "L4-24Q")))
		}, syscall.EIO},
		{"time-sliced type on a MIG GPU", func(t *testing.T, e *env) error {
			return write(e, vfType(h100MIGVF(0)), itoa(typeID(t, e, "H100-SXM5-80GB", "H100XM-4C")))
		}, syscall.EIO},
		{"MIG-backed type without its GPU instance", func(t *testing.T, e *env) error {
			mustGI(t, e.dev(t, sim.DefaultH100MIG), p2g, 0)
			return write(e, vfType(h100MIGVF(0)), itoa(typeID(t, e, "H100-SXM5-80GB", "H100XM-3-40C")))
		}, syscall.EIO},
		{"type of another GPU model", func(t *testing.T, e *env) error {
			return write(e, vfType(vfOf(sim.DefaultL4, 0)), itoa(typeID(t, e, "H100-SXM5-80GB", "H100XM-4C")))
		}, syscall.EIO},
		{"clear while the VM holds the VF", func(t *testing.T, e *env) error {
			writeOK(t, e, vfType(vfOf(sim.DefaultL4, 0)), typeID(t, e, "L4-24GB", "L4-4Q"))
			if err := e.h.OpenDevice(vfOf(sim.DefaultL4, 0), "5f1c0a24-8c4d-4c53-9b2e-4f1b1f7a0001", "vm1"); err != nil {
				t.Fatal(err)
			}
			return write(e, vfType(vfOf(sim.DefaultL4, 0)), "0\n")
		}, syscall.EPERM},
		{"vgpu_params while the VM runs", func(t *testing.T, e *env) error {
			writeOK(t, e, vfType(vfOf(sim.DefaultL4, 0)), typeID(t, e, "L4-24GB", "L4-4Q"))
			if err := e.h.OpenDevice(vfOf(sim.DefaultL4, 0), "5f1c0a24-8c4d-4c53-9b2e-4f1b1f7a0001", "vm1"); err != nil {
				t.Fatal(err)
			}
			return write(e, "bus/pci/devices/"+vfOf(sim.DefaultL4, 0)+"/nvidia/vgpu_params", "enable_uvm=1\n")
		}, syscall.EPERM},
		{"vgpu_params too long", func(t *testing.T, e *env) error {
			return write(e, "bus/pci/devices/"+vfOf(sim.DefaultL4, 0)+"/nvidia/vgpu_params", strings.Repeat("x", 2000))
		}, syscall.E2BIG},
		{"read-only attribute", func(t *testing.T, e *env) error {
			return write(e, "bus/pci/devices/"+vfOf(sim.DefaultL4, 0)+"/nvidia/creatable_vgpu_types", "1\n")
		}, syscall.EACCES},
		{"gpu_instance_id of an idle VF", func(t *testing.T, e *env) error {
			_, err := e.fs.ReadFile("bus/pci/devices/" + h100MIGVF(0) + "/nvidia/gpu_instance_id")
			return err
		}, syscall.ENXIO},
		{"mdev create: short UUID", func(t *testing.T, e *env) error {
			return mdevCreate(e, vfOf(sim.DefaultA10, 0), typeID(t, e, "A10-24GB", "A10-4Q"), "4b20d080")
		}, syscall.EINVAL},
		{"mdev create: not a UUID", func(t *testing.T, e *env) error {
			return mdevCreate(e, vfOf(sim.DefaultA10, 0), typeID(t, e, "A10-24GB", "A10-4Q"), "zzzzzzzz-1b54-4048-85b3-a6a62d165c01")
		}, syscall.EINVAL},
		{"mdev create: UUID in use on another parent", func(t *testing.T, e *env) error {
			id := typeID(t, e, "A10-24GB", "A10-4Q")
			if err := mdevCreate(e, vfOf(sim.DefaultA10, 0), id, uuid1); err != nil {
				t.Fatal(err)
			}
			return mdevCreate(e, vfOf(sim.DefaultA10, 1), id, uuid1)
		}, syscall.EEXIST},
		{"mdev create: VF parent already holds one", func(t *testing.T, e *env) error {
			id := typeID(t, e, "A10-24GB", "A10-4Q")
			if err := mdevCreate(e, vfOf(sim.DefaultA10, 0), id, uuid1); err != nil {
				t.Fatal(err)
			}
			return mdevCreate(e, vfOf(sim.DefaultA10, 0), id, uuid2)
		}, syscall.EIO},
		{"mdev create: homogeneous conflict", func(t *testing.T, e *env) error {
			if err := mdevCreate(e, vfOf(sim.DefaultA10, 0), typeID(t, e, "A10-24GB", "A10-4Q"), uuid1); err != nil {
				t.Fatal(err)
			}
			return mdevCreate(e, vfOf(sim.DefaultA10, 1), typeID(t, e, "A10-24GB", "A10-8Q"), uuid2)
		}, syscall.EIO},
		{"mdev remove: not a number", func(t *testing.T, e *env) error {
			if err := mdevCreate(e, vfOf(sim.DefaultA10, 0), typeID(t, e, "A10-24GB", "A10-4Q"), uuid1); err != nil {
				t.Fatal(err)
			}
			return write(e, "bus/mdev/devices/"+uuid1+"/remove", "yes\n")
		}, syscall.EINVAL},
		{"mdev remove while open", func(t *testing.T, e *env) error {
			if err := mdevCreate(e, vfOf(sim.DefaultA10, 0), typeID(t, e, "A10-24GB", "A10-4Q"), uuid1); err != nil {
				t.Fatal(err)
			}
			if err := e.h.OpenDevice(uuid1, "5f1c0a24-8c4d-4c53-9b2e-4f1b1f7a0001", "vm1"); err != nil {
				t.Fatal(err)
			}
			return write(e, "bus/mdev/devices/"+uuid1+"/remove", "1\n")
		}, syscall.EBUSY},
		{"write to a lost GPU", func(t *testing.T, e *env) error {
			if err := e.h.LoseGPU(sim.DefaultL4); err != nil {
				t.Fatal(err)
			}
			return write(e, vfType(vfOf(sim.DefaultL4, 0)), itoa(typeID(t, e, "L4-24GB", "L4-4Q")))
		}, syscall.EIO},
		{"injected write fault", func(t *testing.T, e *env) error {
			if err := e.h.AddFault(sim.Fault{Op: "write:current_vgpu_type", Errno: int(syscall.ENOMEM), Count: 1}); err != nil {
				t.Fatal(err)
			}
			return write(e, vfType(vfOf(sim.DefaultL4, 0)), itoa(typeID(t, e, "L4-24GB", "L4-4Q")))
		}, syscall.ENOMEM},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, nil)
			err := c.run(t, e)
			var got syscall.Errno
			if !errors.As(err, &got) || got != c.want {
				t.Fatalf("got %v, want errno %v", err, c.want)
			}
		})
	}
}

func TestCreatableListsShrink(t *testing.T) {
	e := newEnv(t, nil)
	q4 := typeID(t, e, "L4-24GB", "L4-4Q")
	writeOK(t, e, vfType(vfOf(sim.DefaultL4, 0)), q4)
	own, _ := e.fs.ReadFile("bus/pci/devices/" + vfOf(sim.DefaultL4, 0) + "/nvidia/creatable_vgpu_types")
	if string(own) != "ID    : vGPU Name\n" {
		t.Fatalf("VF with a vGPU lists %q, want the header only", own)
	}
	other, _ := e.fs.ReadFile("bus/pci/devices/" + vfOf(sim.DefaultL4, 1) + "/nvidia/creatable_vgpu_types")
	lines := strings.Split(strings.TrimSpace(string(other)), "\n")
	if len(lines) != 2 || !strings.HasSuffix(lines[1], "NVIDIA L4-4Q") {
		t.Fatalf("free VF lists %q, want the header and L4-4Q only", other)
	}
	// The clear makes every type creatable again.
	if err := write(e, vfType(vfOf(sim.DefaultL4, 0)), "0\n"); err != nil {
		t.Fatal(err)
	}
	other, _ = e.fs.ReadFile("bus/pci/devices/" + vfOf(sim.DefaultL4, 1) + "/nvidia/creatable_vgpu_types")
	if n := strings.Count(string(other), "\n"); n < 10 {
		t.Fatalf("after clear the free VF lists %d lines: %q", n, other)
	}
}

func TestMdevEffects(t *testing.T) {
	e := newEnv(t, nil)
	id := typeID(t, e, "A10-24GB", "A10-4Q")
	avail := func(parent string) string {
		b, err := e.fs.ReadFile("class/mdev_bus/" + parent + "/mdev_supported_types/nvidia-" + itoa(id) + "/available_instances")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if a := avail(vfOf(sim.DefaultA10, 0)); a != "1" {
		t.Fatalf("available before = %s, want 1", a)
	}
	if err := mdevCreate(e, vfOf(sim.DefaultA10, 0), id, strings.ToUpper(uuid1)+"\n"); err != nil {
		t.Fatal(err)
	}
	if a := avail(vfOf(sim.DefaultA10, 0)); a != "0" {
		t.Fatalf("available after = %s, want 0", a)
	}
	link, err := e.fs.Readlink("bus/mdev/devices/" + uuid1 + "/mdev_type")
	if err != nil || filepath.Base(link) != "nvidia-"+itoa(id) {
		t.Fatalf("mdev_type link = %q, %v", link, err)
	}
	if err := write(e, "bus/mdev/devices/"+uuid1+"/remove", "0\n"); err != nil {
		t.Fatalf("remove 0 is a no-op: %v", err)
	}
	if err := write(e, "bus/mdev/devices/"+uuid1+"/remove", "1\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.fs.Stat("bus/mdev/devices/" + uuid1); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("mdev still present: %v", err)
	}
	if a := avail(vfOf(sim.DefaultA10, 0)); a != "1" {
		t.Fatalf("available after remove = %s, want 1", a)
	}
	ev, _, err := e.h.UeventsSince(0)
	if err != nil || len(ev) != 2 || ev[0].Action != "add" || ev[1].Action != "remove" || ev[0].Subsystem != "mdev" {
		t.Fatalf("uevents = %+v, %v", ev, err)
	}
}

func TestMIGBackedVGPUPicksMatchingGI(t *testing.T) {
	e := newEnv(t, nil)
	d := e.dev(t, sim.DefaultH100MIG)
	gi := mustGI(t, d, p3g, 4)
	info, _ := gi.GetInfo()
	writeOK(t, e, vfType(h100MIGVF(3)), typeID(t, e, "H100-SXM5-80GB", "H100XM-3-40C"))
	b, err := e.fs.ReadFile("bus/pci/devices/" + h100MIGVF(3) + "/nvidia/gpu_instance_id")
	if err != nil || strings.TrimSpace(string(b)) != itoa(int(info.Id)) {
		t.Fatalf("gpu_instance_id = %q, %v; want %d", b, err, info.Id)
	}
	// The GI hosts one such vGPU: a second one has no room.
	if err := write(e, vfType(h100MIGVF(4)), itoa(typeID(t, e, "H100-SXM5-80GB", "H100XM-3-40C"))); !errors.Is(err, syscall.EIO) {
		t.Fatalf("second MIG-backed vGPU: %v, want EIO", err)
	}
}

func TestStateSurvivesProcessAndReboot(t *testing.T) {
	dir := t.TempDir()
	cat := catalog(t)
	h1, err := sim.Open(dir, nil, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lib := h1.NVML()
	lib.Init()
	d, _ := lib.DeviceGetHandleByPciBusId(sim.DefaultH100MIG)
	mustGI(t, d, p3g, 0)
	if err := h1.FS().WriteFile(vfType(vfOf(sim.DefaultL4, 0)), []byte("1\n")); err == nil {
		t.Log("type 1 accepted?")
	}
	h1.Close()

	// A second "process" sees the GPU instance.
	h2, err := sim.Open(dir, nil, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	s, _ := h2.Summary()
	if !strings.Contains(s, "gi2(p9@0+4") {
		t.Fatalf("after reopen: %s", s)
	}
	// Two hosts open on one directory see each other's changes.
	h3, err := sim.Open(dir, nil, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer h3.Close()
	if err := h3.LoseGPU(sim.DefaultL4); err != nil {
		t.Fatal(err)
	}
	lib2 := h2.NVML()
	lib2.Init()
	d2, _ := lib2.DeviceGetHandleByPciBusId(sim.DefaultL4)
	if _, r := d2.GetUUID(); r != nvml.ERROR_GPU_IS_LOST {
		t.Fatalf("other process's GPU loss not seen: %v", r)
	}
	if err := h2.Reboot(); err != nil {
		t.Fatal(err)
	}
	s, _ = h3.Summary()
	if strings.Contains(s, "gi") || strings.Contains(s, "lost=true") {
		t.Fatalf("after reboot: %s", s)
	}
	if !strings.Contains(s, sim.DefaultH100MIG+" H100-SXM5-80GB mig=true/true") {
		t.Fatalf("MIG mode lost on reboot: %s", s)
	}
	// A different host description on the same directory is refused.
	other := sim.DefaultSpec()
	other.GPUs = other.GPUs[:1]
	if _, err := sim.Open(dir, other, cat, sim.OpenOptions{}); !errors.Is(err, sim.ErrSpecMismatch) {
		t.Fatalf("open with another spec: %v, want ErrSpecMismatch", err)
	}
}

func TestSpecValidation(t *testing.T) {
	cat := catalog(t)
	cases := []struct {
		name, yaml, want string
	}{
		{"no version", "gpus: [{model: L4-24GB}]", "version"},
		{"unknown field", "version: v1\ngpus: [{model: L4-24GB, colour: red}]", "colour"},
		{"unknown model", "version: v1\ngpus: [{model: Z9000}]", "gpus[0].model"},
		{"bad pci", "version: v1\ngpus: [{model: L4-24GB, pci: '0000:zz:00.0'}]", "gpus[0].pci"},
		{"duplicate pci", "version: v1\ngpus: [{model: L4-24GB, pci: '0000:41:00.0'}, {model: L4-24GB, pci: '0000:41:00.0'}]", "gpus[1].pci"},
		{"flavour the model lacks", "version: v1\ngpus: [{model: T4-16GB, flavour: vfio}]", "gpus[0].flavour"},
		{"MIG on a non-MIG GPU", "version: v1\ngpus: [{model: L4-24GB, mig: true}]", "gpus[0].mig"},
		{"no GPUs", "version: v1\ngpus: []", "gpus"},
		{"bad latency", "version: v1\ngpus: [{model: L4-24GB}]\noptions: {callLatency: fast}", "callLatency"},
		{"bad op latency", "version: v1\ngpus: [{model: L4-24GB}]\noptions: {latency: {mdevCreate: soon}}", "options.latency.mdevCreate"},
		{"op latency too long", "version: v1\ngpus: [{model: L4-24GB}]\noptions: {latency: {migMode: 1h}}", "options.latency.migMode"},
		{"jitter above 1", "version: v1\ngpus: [{model: L4-24GB}]\noptions: {latency: {jitter: 2}}", "options.latency.jitter"},
		{"unknown latency op", "version: v1\ngpus: [{model: L4-24GB}]\noptions: {latency: {reboot: 1s}}", "reboot"},
		{"yaml syntax", "version: v1\ngpus: [", "host.yaml"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := sim.ParseSpec("host.yaml", []byte(c.yaml))
			if err == nil {
				err = s.Validate(cat)
			}
			if !errors.Is(err, sim.ErrBadSpec) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want ErrBadSpec naming %q", err, c.want)
			}
		})
	}
}

// sriov-manage -e on a GPU whose VFs are enabled is harmless (reference
// 2.1); -d takes the VFs and, on a legacy mdev GPU, the mdevs they parent.
func TestSetVFs(t *testing.T) {
	e := newEnv(t, nil)
	mustGI(t, e.dev(t, sim.DefaultH100MIG), p3g, 0)
	id := typeID(t, e, "A10-24GB", "A10-4Q")
	if err := mdevCreate(e, vfOf(sim.DefaultA10, 0), id, uuid1); err != nil {
		t.Fatal(err)
	}
	before, _ := e.h.Summary()
	for _, g := range []string{sim.DefaultH100MIG, sim.DefaultA10} {
		if err := e.h.SetVFs(g, true); err != nil {
			t.Fatalf("enable again on %s: %v", g, err)
		}
	}
	if after, _ := e.h.Summary(); after != before {
		t.Fatalf("enabling enabled VFs changed the host:\n%s\nwas\n%s", after, before)
	}
	if err := e.h.SetVFs(sim.DefaultA10, false); err != nil {
		t.Fatal(err)
	}
	sum, _ := e.h.Summary()
	if strings.Contains(sum, "mdev") {
		t.Fatalf("mdevs outlived their parent VFs:\n%s", sum)
	}
	if _, err := e.fs.Stat("bus/mdev/devices/" + uuid1); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("mdev device still in sysfs: %v", err)
	}
}
