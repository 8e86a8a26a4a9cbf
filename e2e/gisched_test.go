package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// rtxProPCI is the RTX PRO 6000 Blackwell of the per-GPU-instance
// scheduler test's host.
const rtxProPCI = "0000:c1:00.0"

// driverGISched reads the scheduler of GPU instance gi as the (simulated)
// driver has it: policy and time slice in ns.
func driverGISched(t *testing.T, h *sim.Host, pci string, gi int) (uint32, uint32) {
	t.Helper()
	nv := h.NVML()
	if ret := nv.Init(); ret != nvml.SUCCESS {
		t.Fatalf("NVML init: %v", ret)
	}
	defer nv.Shutdown()
	dev, ret := nv.DeviceGetHandleByPciBusId(pci)
	if ret != nvml.SUCCESS {
		t.Fatalf("GPU %s: %v", pci, ret)
	}
	x, ret := dev.GetGpuInstanceById(gi)
	if ret != nvml.SUCCESS {
		t.Fatalf("GPU instance %d of %s: %v", gi, pci, ret)
	}
	s, ret := x.GetVgpuSchedulerState_v2(nvml.VgpuSchedulerStateInfo_v2{EngineId: nvml.VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS})
	if ret != nvml.SUCCESS {
		t.Fatalf("GpuInstanceGetVgpuSchedulerState_v2 of %s GPU instance %d: %v", pci, gi, ret)
	}
	return s.SchedulerPolicy, s.Timeslice
}

// docGISched is gpu scheduler --gpu-instance's -o json document.
type docGISched struct {
	APIVersion  string `json:"apiVersion"`
	Kind        string `json:"kind"`
	GPU         string `json:"gpu"`
	GPUInstance *int   `json:"gpuInstance,omitempty"`
	Mode        string `json:"mode"`
	Policy      string `json:"policy,omitempty"`
	TimesliceNs int64  `json:"timesliceNs,omitempty"`
	Pending     bool   `json:"pending"`
	Detail      string `json:"detail,omitempty"`
}

// TestCLIGPUInstanceScheduler: the per-GPU-instance scheduler of an RTX
// PRO 6000 Blackwell through vgpuctl: bad requests refused by name with
// nothing changed; a pin set on an idle GPU instance; pending while a VM
// runs in it and set when the VM stops; set again after a driver reload;
// and after a reboot, on the GPU instance the next start re-creates.
func TestCLIGPUInstanceScheduler(t *testing.T) {
	spec := filepath.Join(t.TempDir(), "host.yaml")
	if err := os.WriteFile(spec, []byte("version: v1\ngpus:\n"+
		"  - {model: RTX-PRO-6000-BSE-96GB, pci: \""+rtxProPCI+"\", flavour: vfio, mig: true}\n"+
		"  - {model: H100-SXM5-80GB, pci: \""+sim.DefaultH100MIG+"\", flavour: vfio, mig: true}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{args: []string{"--sim-host", spec}})
	h := openSim(t, d.stateDir)
	d.ctl(t, "tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited").must(t, "tenant define")
	in := decodeSchema[docInstance](t, d.ctl(t, "create", "RTX Pro 6000 Blackwell DC-1-6Q", "--tenant", "acme", "--gpu", rtxProPCI, "-o", "json").must(t, "create")).Instance
	if in.MIG == nil || in.VGPU == nil || in.VGPU.VF == "" {
		t.Fatalf("created %+v: want a MIG-backed vGPU on a VF", in)
	}
	gi := in.MIG.GPUInstanceID
	giArg := strconv.Itoa(gi)
	hopperGI := decodeSchema[docInstance](t, d.ctl(t, "create", "3g.40gb", "--tenant", "acme", "--gpu", sim.DefaultH100MIG, "-o", "json").must(t, "create 3g.40gb")).Instance.MIG.GPUInstanceID

	before := d.simOut(t, "summary")
	for _, c := range []struct {
		name string
		args []string
		code int
		say  string
	}{
		{"negative GPU instance", []string{rtxProPCI, "--gpu-instance", "-1", "--policy", "equal_share"}, 2, "--gpu-instance -1"},
		{"no such GPU instance", []string{rtxProPCI, "--gpu-instance", "99", "--policy", "equal_share"}, 4, "no GPU instance 99"},
		{"Hopper", []string{sim.DefaultH100MIG, "--gpu-instance", strconv.Itoa(hopperGI), "--policy", "equal_share"}, 2, "no per-GPU-instance vGPU scheduler"},
		{"unknown GPU", []string{"0000:ff:00.0", "--gpu-instance", giArg, "--policy", "equal_share"}, 4, "no GPU"},
		{"slice out of range", []string{rtxProPCI, "--gpu-instance", giArg, "--policy", "equal_share", "--timeslice", "31ms"}, 2, "outside"},
		{"unknown policy", []string{rtxProPCI, "--gpu-instance", giArg, "--policy", "round_robin"}, 2, "round_robin"},
		{"no policy", []string{rtxProPCI, "--gpu-instance", giArg}, 2, "--policy"},
	} {
		r := d.ctl(t, append([]string{"gpu", "scheduler"}, c.args...)...)
		if r.code != c.code || !strings.Contains(r.err, c.say) {
			t.Errorf("%s: exit %d %q; want exit %d saying %q", c.name, r.code, r.err, c.code, c.say)
		}
	}
	if after := d.simOut(t, "summary"); after != before {
		t.Fatalf("refused requests changed the host:\n%s\nwas\n%s", after, before)
	}

	// An idle GPU instance takes the pin at once.
	doc := decodeSchema[docGISched](t, d.ctl(t, "gpu", "scheduler", rtxProPCI, "--gpu-instance", giArg, "--policy", "equal_share", "--timeslice", "5ms", "-o", "json").must(t, "gpu scheduler --gpu-instance"))
	if doc.Kind != "GPUInstanceScheduler" || doc.GPUInstance == nil || *doc.GPUInstance != gi || doc.Mode != "pinned" || doc.Policy != "equal_share" || doc.TimesliceNs != 5_000_000 || doc.Pending {
		t.Fatalf("pin on an idle GPU instance: %+v", doc)
	}
	if p, ts := driverGISched(t, h, rtxProPCI, gi); p != nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE || ts != 5_000_000 {
		t.Fatalf("driver holds policy %d, time slice %d ns; want equal share, 5ms", p, ts)
	}
	g := decodeSchema[docGPU](t, d.ctl(t, "gpu", "show", rtxProPCI, "-o", "json").must(t, "gpu show"))
	if len(g.GPU.GPUInstanceSchedulers) != 1 || g.GPU.GPUInstanceSchedulers[0].GPUInstance != gi || g.GPU.GPUInstanceSchedulers[0].Mode != "pinned" {
		t.Fatalf("gpu show: GPU instance schedulers %+v", g.GPU.GPUInstanceSchedulers)
	}
	if r := d.ctl(t, "gpu", "show", rtxProPCI).must(t, "gpu show"); !strings.Contains(r.out, "GPU instance "+giArg+" scheduler: pinned: equal_share, time slice 5ms\n") {
		t.Fatalf("gpu show text:\n%s", r.out)
	}

	// A VM runs in the GPU instance: the pin is pending until it stops.
	d.sim(t, "open-device", in.VGPU.VF, "--vm-uuid", "3c8d7f0e-5a41-4b7e-9d2c-7a1e6b5f4c31", "--vm-name", "vm1")
	r := d.ctl(t, "gpu", "scheduler", rtxProPCI, "--gpu-instance", giArg, "--policy", "fixed_share", "--timeslice", "2ms").must(t, "gpu scheduler while a VM runs")
	if !strings.Contains(r.out, "pending: the driver refuses a change while a VM runs in the GPU instance") {
		t.Fatalf("gpu scheduler while a VM runs: %q", r.out)
	}
	if p, _ := driverGISched(t, h, rtxProPCI, gi); p != nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE {
		t.Fatalf("the driver changed under a running VM: policy %d", p)
	}
	d.sim(t, "close-device", in.VGPU.VF)
	awaitGISched(t, d, h, gi, "after the VM stopped")

	// A driver reload forgets it; vgpud sets it again.
	d.sim(t, "driver", "unload")
	d.sim(t, "driver", "load")
	awaitGISched(t, d, h, gi, "after a driver reload")

	// A reboot takes the GPU instance; the next start re-creates it and
	// sets the pin on it.
	d.stop(t)
	d.sim(t, "reboot")
	d = startBusDaemon(t, bus, busDaemonOpts{stateDir: d.stateDir, args: []string{"--sim-host", spec}})
	in = decodeSchema[docInstance](t, d.ctl(t, "show", in.UUID, "-o", "json").must(t, "show")).Instance
	awaitGISched(t, d, h, in.MIG.GPUInstanceID, "after a reboot")

	// Dropped: the driver's setting stays, nothing pins it any more.
	if r := d.ctl(t, "gpu", "scheduler", rtxProPCI, "--gpu-instance", strconv.Itoa(in.MIG.GPUInstanceID), "--mode", "adaptive").must(t, "--mode adaptive"); !strings.Contains(r.out, "is not pinned") {
		t.Fatalf("--mode adaptive: %q", r.out)
	}
	g = decodeSchema[docGPU](t, d.ctl(t, "gpu", "show", rtxProPCI, "-o", "json").must(t, "gpu show"))
	if len(g.GPU.GPUInstanceSchedulers) != 1 || g.GPU.GPUInstanceSchedulers[0].Mode != "adaptive" {
		t.Fatalf("after --mode adaptive: %+v", g.GPU.GPUInstanceSchedulers)
	}

	// A layout pins it again on the GPU instance that holds its line's
	// vGPUs; applied again, it changes nothing.
	layout := filepath.Join(t.TempDir(), "layout.yaml")
	if err := os.WriteFile(layout, []byte("version: v1\nlayout:\n  - gpu: \""+rtxProPCI+"\"\n    scope: [mig-vgpu]\n    instances:\n"+
		"      - {profile: \"RTX Pro 6000 Blackwell DC-1-6Q\", tenant: acme, count: 1, scheduler: {policy: fixed_share, timeslice: 2ms}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := d.ctl(t, "apply", "-f", layout).must(t, "apply"); !strings.Contains(r.out, "set the vGPU scheduler of the GPU instances holding RTX Pro 6000 Blackwell DC-1-6Q") {
		t.Fatalf("apply:\n%s", r.out)
	}
	awaitGISched(t, d, h, in.MIG.GPUInstanceID, "after apply")
	if r := d.ctl(t, "apply", "-f", layout, "--dry-run").must(t, "apply again"); !strings.Contains(r.out, "no changes") {
		t.Fatalf("apply again:\n%s", r.out)
	}
}

// awaitGISched waits until the driver holds the fixed-share 2 ms pin on
// GPU instance gi and vgpuctl shows it set, not pending.
func awaitGISched(t *testing.T, d *busDaemon, h *sim.Host, gi int, when string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		p, ts := driverGISched(t, h, rtxProPCI, gi)
		g := decodeSchema[docGPU](t, d.ctl(t, "gpu", "show", rtxProPCI, "-o", "json").must(t, "gpu show"))
		shown := false
		for _, s := range g.GPU.GPUInstanceSchedulers {
			shown = shown || s.GPUInstance == gi && s.Mode == "pinned" && s.Policy == "fixed_share" && !s.Pending
		}
		if p == nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE && ts == 2_000_000 && shown {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("20s %s: driver policy %d, time slice %d; gpu show %+v", when, p, ts, g.GPU.GPUInstanceSchedulers)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
