package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
)

// TestCLIGPUInstanceSchedulerGone: a GPU-instance pin does not outlive
// what ends its GPU instance. The pin of a GPU instance destroyed by hand
// stays pending, gpu show names it by the id it had, and `gpu scheduler
// --gpu-instance N --clear` drops it; the destroy of the last vGPU of a
// pinned GPU instance drops its pin; MIG off drops the pins left.
func TestCLIGPUInstanceSchedulerGone(t *testing.T) {
	spec := filepath.Join(t.TempDir(), "host.yaml")
	if err := os.WriteFile(spec, []byte("version: v1\ngpus:\n"+
		"  - {model: RTX-PRO-6000-BSE-96GB, pci: \""+rtxProPCI+"\", flavour: vfio, mig: true}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{args: []string{"--sim-host", spec}})
	pins := func() int {
		g := decodeSchema[docGPU](t, d.ctl(t, "gpu", "show", rtxProPCI, "-o", "json").must(t, "gpu show"))
		n := 0
		for _, s := range g.GPU.GPUInstanceSchedulers {
			if s.Mode == "pinned" {
				n++
			}
		}
		return n
	}
	// A GPU instance made by hand (1g.24gb+gfx, profile index 10), pinned,
	// then destroyed by hand.
	handGI := func() string {
		out := d.simOut(t, "create-gi", rtxProPCI, "10")
		id := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(out), "GPU instance "))
		d.ctl(t, "reconcile").must(t, "reconcile")
		d.ctl(t, "gpu", "scheduler", rtxProPCI, "--gpu-instance", id, "--policy", "equal_share").must(t, "pin a hand-made GPU instance")
		d.sim(t, "destroy-gi", rtxProPCI, id)
		d.ctl(t, "reconcile").must(t, "reconcile")
		return id
	}
	id := handGI()
	if r := d.ctl(t, "gpu", "show", rtxProPCI).must(t, "gpu show"); !strings.Contains(r.out, "GPU instance "+id+", 1g.24gb+gfx at ") || !strings.Contains(r.out, "(gone; --gpu-instance "+id+" --clear drops its pin) scheduler: pinned: equal_share") {
		t.Fatalf("gpu show does not name the gone GPU instance's pin:\n%s", r.out)
	}
	if r := d.ctl(t, "gpu", "scheduler", rtxProPCI, "--gpu-instance", "99", "--clear"); r.code != 4 || !strings.Contains(r.err, "no GPU instance 99") {
		t.Fatalf("--clear of an id nothing has: exit %d %q; want NotFound", r.code, r.err)
	}
	if r := d.ctl(t, "gpu", "scheduler", rtxProPCI, "--gpu-instance", id, "--clear").must(t, "--clear"); !strings.Contains(r.out, "is not pinned") {
		t.Fatalf("--clear: %q", r.out)
	}
	if n := pins(); n != 0 {
		t.Fatalf("%d pins after --clear", n)
	}

	// The last vGPU of a pinned GPU instance destroyed: its pin goes.
	d.ctl(t, "tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited").must(t, "tenant define")
	in := decodeSchema[docInstance](t, d.ctl(t, "create", "RTX Pro 6000 Blackwell DC-1-6Q", "--tenant", "acme", "--gpu", rtxProPCI, "-o", "json").must(t, "create")).Instance
	d.ctl(t, "gpu", "scheduler", rtxProPCI, "--gpu-instance", strconv.Itoa(in.MIG.GPUInstanceID), "--policy", "fixed_share").must(t, "pin")
	d.ctl(t, "destroy", in.UUID).must(t, "destroy")
	if n := pins(); n != 0 {
		t.Fatalf("%d pins after the destroy of the GPU instance's last vGPU", n)
	}
	if !strings.Contains(d.log(), "GPU instance scheduler pin dropped") {
		t.Fatalf("the log does not say the pin was dropped\n%s", tailText(d.log(), 3000))
	}

	// MIG off drops a gone GPU instance's pin.
	handGI()
	if n := pins(); n != 1 {
		t.Fatalf("%d pins, want the gone GPU instance's", n)
	}
	d.ctl(t, "gpu", "mig", rtxProPCI, "off").must(t, "gpu mig off")
	if n := pins(); n != 0 {
		t.Fatalf("%d pins after MIG off", n)
	}
}
