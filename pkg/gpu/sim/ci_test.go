package sim_test

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// ciProfileInfo reads a compute-instance profile of a GPU instance.
func ciProfileInfo(t *testing.T, gi nvml.GpuInstance, idx int) nvml.ComputeInstanceProfileInfo {
	t.Helper()
	info, r := gi.GetComputeInstanceProfileInfo(idx, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if r != nvml.SUCCESS {
		t.Fatalf("compute-instance profile %d: %v", idx, r)
	}
	return info
}

func createCIAt(t *testing.T, gi nvml.GpuInstance, idx, start int) (nvml.ComputeInstance, nvml.Return) {
	t.Helper()
	info := ciProfileInfo(t, gi, idx)
	return gi.CreateComputeInstanceWithPlacement(&info, &nvml.ComputeInstancePlacement{Start: uint32(start), Size: info.SliceCount})
}

func mustCIAt(t *testing.T, gi nvml.GpuInstance, idx, start int) nvml.ComputeInstance {
	t.Helper()
	c, r := createCIAt(t, gi, idx, start)
	if r != nvml.SUCCESS {
		t.Fatalf("compute instance profile %d at %d: %v", idx, start, r)
	}
	return c
}

// TestComputeInstanceRefusals: what the driver refuses for compute
// instances inside a GPU instance, with its return codes (reference 3.3,
// 3.7).
func TestComputeInstanceRefusals(t *testing.T) {
	const c1, c2, c3 = nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE
	cases := []struct {
		name string
		run  func(t *testing.T, e *env) nvml.Return
		want nvml.Return
	}{
		{"three 1c in a 3g, then a fourth", func(t *testing.T, e *env) nvml.Return {
			gi := mustGI(t, e.dev(t, sim.DefaultH100MIG), p3g, 0)
			for s := 0; s < 3; s++ {
				mustCIAt(t, gi, c1, s)
			}
			info := ciProfileInfo(t, gi, c1)
			_, r := gi.CreateComputeInstance(&info)
			return r
		}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"1c where another compute instance sits", func(t *testing.T, e *env) nvml.Return {
			gi := mustGI(t, e.dev(t, sim.DefaultH100MIG), p3g, 0)
			mustCIAt(t, gi, c2, 0)
			_, r := createCIAt(t, gi, c1, 1)
			return r
		}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"2c at a start it may not take (1 in a 3g)", func(t *testing.T, e *env) nvml.Return {
			_, r := createCIAt(t, mustGI(t, e.dev(t, sim.DefaultH100MIG), p3g, 0), c2, 1)
			return r
		}, nvml.ERROR_INVALID_ARGUMENT},
		{"2c beside two 1c in a 3g", func(t *testing.T, e *env) nvml.Return {
			gi := mustGI(t, e.dev(t, sim.DefaultH100MIG), p3g, 0)
			mustCIAt(t, gi, c1, 0)
			mustCIAt(t, gi, c1, 2)
			info := ciProfileInfo(t, gi, c2)
			_, r := gi.CreateComputeInstance(&info)
			return r
		}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"3c profile in a 2g (no such profile in the GI)", func(t *testing.T, e *env) nvml.Return {
			gi := mustGI(t, e.dev(t, sim.DefaultH100MIG), p2g, 0)
			_, r := gi.GetComputeInstanceProfileInfo(c3, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
			return r
		}, nvml.ERROR_NOT_SUPPORTED},
		{"create with a profile the GI lacks", func(t *testing.T, e *env) nvml.Return {
			gi := mustGI(t, e.dev(t, sim.DefaultH100MIG), p2g, 0)
			_, r := gi.CreateComputeInstance(&nvml.ComputeInstanceProfileInfo{Id: c3})
			return r
		}, nvml.ERROR_NOT_SUPPORTED},
		{"placement size not the profile's", func(t *testing.T, e *env) nvml.Return {
			gi := mustGI(t, e.dev(t, sim.DefaultH100MIG), p3g, 0)
			info := ciProfileInfo(t, gi, c1)
			_, r := gi.CreateComputeInstanceWithPlacement(&info, &nvml.ComputeInstancePlacement{Start: 0, Size: 2})
			return r
		}, nvml.ERROR_INVALID_ARGUMENT},
		{"destroy a GI holding 1c compute instances", func(t *testing.T, e *env) nvml.Return {
			gi := mustGI(t, e.dev(t, sim.DefaultH100MIG), p3g, 0)
			mustCIAt(t, gi, c1, 1)
			return gi.Destroy()
		}, nvml.ERROR_IN_USE},
		{"compute instance in a GI hosting a MIG-backed vGPU", func(t *testing.T, e *env) nvml.Return {
			gi := mustGI(t, e.dev(t, sim.DefaultH100MIG), p3g, 0)
			writeOK(t, e, vfType(h100MIGVF(0)), typeID(t, e, "H100-SXM5-80GB", "H100XM-3-40C"))
			info := ciProfileInfo(t, gi, c1)
			if n, r := gi.GetComputeInstanceRemainingCapacity(&info); r != nvml.SUCCESS || n != 0 {
				t.Fatalf("remaining 1c beside a vGPU: %d, %v; want 0", n, r)
			}
			_, r := createCIAt(t, gi, c1, 0)
			return r
		}, nvml.ERROR_IN_USE},
		{"destroy a compute instance twice", func(t *testing.T, e *env) nvml.Return {
			gi := mustGI(t, e.dev(t, sim.DefaultH100MIG), p3g, 0)
			c := mustCIAt(t, gi, c1, 2)
			if r := c.Destroy(); r != nvml.SUCCESS {
				t.Fatal(r)
			}
			return c.Destroy()
		}, nvml.ERROR_INVALID_ARGUMENT},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.run(t, newEnv(t, nil)); got != c.want {
				t.Fatalf("got %v (%d), want %v (%d)", got, got, c.want, c.want)
			}
		})
	}
}

// TestComputeInstancesShareAGI: three 1c compute instances fill a 3g GPU
// instance at starts 0, 1, 2; the GI goes only once they are gone.
func TestComputeInstancesShareAGI(t *testing.T) {
	e := newEnv(t, nil)
	gi := mustGI(t, e.dev(t, sim.DefaultH100MIG), p3g, 4)
	var cis []nvml.ComputeInstance
	for s := 0; s < 3; s++ {
		cis = append(cis, mustCIAt(t, gi, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, s))
	}
	info := ciProfileInfo(t, gi, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE)
	if n, r := gi.GetComputeInstanceRemainingCapacity(&info); r != nvml.SUCCESS || n != 0 {
		t.Fatalf("remaining 1c: %d, %v; want 0", n, r)
	}
	for i, c := range cis {
		ci, r := c.GetInfo()
		if r != nvml.SUCCESS || int(ci.Placement.Start) != i || ci.Placement.Size != 1 {
			t.Fatalf("compute instance %d: %+v, %v", i, ci.Placement, r)
		}
		if r := c.Destroy(); r != nvml.SUCCESS {
			t.Fatal(r)
		}
		want := nvml.ERROR_IN_USE
		if i == len(cis)-1 {
			want = nvml.SUCCESS
		}
		if r := gi.Destroy(); r != want {
			t.Fatalf("destroy GI with %d compute instances left: %v, want %v", len(cis)-1-i, r, want)
		}
	}
}
