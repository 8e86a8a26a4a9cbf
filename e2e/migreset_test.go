package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
)

// TestMIGModeCarriedThrough: on a simulated host whose NVML sessions hold
// the GPUs (vgpud's own included), MIG on and off through vgpuctl on a GPU
// with SR-IOV VFs and vGPUs of vgpud's, with no VM, goes through with no
// manual step (vgpud lets go of its session, disables the VFs, resets the
// GPU and enables them again); the same change with a VM running a vGPU
// of the GPU is refused by the dry run and the apply before any change,
// naming the VM.
func TestMIGModeCarriedThrough(t *testing.T) {
	const gpu = sim.DefaultH100TS
	dir := t.TempDir()
	spec := filepath.Join(dir, "host.yaml")
	if err := os.WriteFile(spec, []byte("version: v1\ngpus:\n"+
		"  - {model: H100-SXM5-80GB, pci: \""+gpu+"\", flavour: vfio}\n"+
		"options: {nvmlSessions: true}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	layout := func(mig bool) string {
		p := filepath.Join(dir, "mig.yaml")
		m := "false"
		if mig {
			m = "true"
		}
		if err := os.WriteFile(p, []byte("version: v1\nlayout:\n  - gpu: \""+gpu+"\"\n    mig: "+m+"\n    instances: []\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{args: []string{"--sim-host", spec}})
	migOn := func() bool {
		for _, g := range decodeSchema[docList[schemaGPU]](t, d.ctl(t, "gpus", "-o", "json").must(t, "gpus")).Items {
			if g.PCI == gpu {
				return g.MIG.Enabled
			}
		}
		t.Fatalf("gpus lacks %s", gpu)
		return false
	}
	d.ctl(t, "tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited").must(t, "tenant define")
	d.ctl(t, "create", "H100XM-20C", "--tenant", "acme", "--gpu", gpu).must(t, "create")
	d.ctl(t, "create", "H100XM-20C", "--tenant", "acme", "--gpu", gpu).must(t, "create")

	// The dry run says the reset is vgpud's; the apply destroys the
	// vGPUs and carries MIG on through it.
	r := d.ctl(t, "apply", "-f", layout(true), "--dry-run").must(t, "apply --dry-run")
	if !strings.Contains(r.out, "through a GPU reset") || !strings.Contains(r.out, "disable its SR-IOV VFs") {
		t.Fatalf("dry run:\n%s", r.out)
	}
	d.ctl(t, "apply", "-f", layout(true)).must(t, "apply MIG on")
	if !migOn() {
		t.Fatalf("MIG not on after the apply\n%s", tailText(d.log(), 4000))
	}
	if !strings.Contains(d.log(), "MIG mode change carried through") {
		t.Fatalf("the log does not report the change\n%s", tailText(d.log(), 4000))
	}
	// And off again with vgpuctl gpu mig.
	d.ctl(t, "gpu", "mig", gpu, "off").must(t, "gpu mig off")
	if migOn() {
		t.Fatal("MIG still on after gpu mig off")
	}

	// A VM runs a vGPU of the GPU: refused before any change, naming it.
	in := decodeSchema[docInstance](t, d.ctl(t, "create", "H100XM-20C", "--tenant", "acme", "--gpu", gpu, "-o", "json").must(t, "create")).Instance
	d.sim(t, "open-device", in.VGPU.VF, "--vm-uuid", "3c8d7f0e-5a41-4b7e-9d2c-7a1e6b5f4c32", "--vm-name", "vm1")
	d.ctl(t, "reconcile").must(t, "reconcile")
	before := d.simOut(t, "summary")
	for _, args := range [][]string{{"apply", "-f", layout(true), "--dry-run"}, {"apply", "-f", layout(true)}} {
		r := d.ctl(t, args...)
		if r.code != 7 || !strings.Contains(r.err, "VM 3c8d7f0e-5a41-4b7e-9d2c-7a1e6b5f4c32 runs a vGPU") {
			t.Fatalf("vgpuctl %v with a VM running: exit %d %q; want Busy naming the VM", args, r.code, r.err)
		}
	}
	if after := d.simOut(t, "summary"); after != before {
		t.Fatalf("the refused apply changed the host:\n%s\nwas\n%s", after, before)
	}
	if migOn() {
		t.Fatal("MIG on after the refusal")
	}
}

// TestMIGModeKilledAtEachStep: vgpud killed (kill -9 at a crash point) at
// each step of a MIG mode change carried through a GPU reset; the next
// start finishes it: MIG on, the VFs back, nothing left pending.
func TestMIGModeKilledAtEachStep(t *testing.T) {
	const gpu = sim.DefaultH100TS
	for _, p := range []string{manager.CrashMIGIntent, manager.CrashMIGRelease, manager.CrashMIGVFsOff, manager.CrashMIGReset, manager.CrashMIGVFsOn} {
		t.Run(p, func(t *testing.T) {
			spec := filepath.Join(t.TempDir(), "host.yaml")
			if err := os.WriteFile(spec, []byte("version: v1\ngpus:\n"+
				"  - {model: H100-SXM5-80GB, pci: \""+gpu+"\", flavour: vfio}\n"+
				"options: {nvmlSessions: true}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			bus := testbus.Start(t)
			d := startBusDaemon(t, bus, busDaemonOpts{args: []string{"--sim-host", spec}, env: []string{"VGPUD_CRASH_AT=" + p}})
			if r := d.ctl(t, "gpu", "mig", gpu, "on"); r.code == 0 {
				t.Fatalf("gpu mig on returned success though vgpud was to die at %s", p)
			}
			select {
			case <-d.done:
			case <-time.After(15 * time.Second):
				t.Fatalf("vgpud did not die at %s", p)
			}
			d = startBusDaemon(t, bus, busDaemonOpts{stateDir: d.stateDir, args: []string{"--sim-host", spec}})
			var g schemaGPU
			for _, x := range decodeSchema[docList[schemaGPU]](t, d.ctl(t, "gpus", "-o", "json").must(t, "gpus")).Items {
				if x.PCI == gpu {
					g = x
				}
			}
			if !g.MIG.Enabled || g.VGPU.NumVFs == 0 {
				t.Fatalf("after the restart: MIG %+v, VFs %d; want MIG on, the VFs back\n%s", g.MIG, g.VGPU.NumVFs, tailText(d.log(), 4000))
			}
			if r := d.ctl(t, "reconcile").must(t, "reconcile"); !strings.Contains(r.out, " 0 pending") {
				t.Fatalf("reconcile after the restart:\n%s", r.out)
			}
		})
	}
}
