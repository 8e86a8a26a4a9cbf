package e2e

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// TestCLIComputeInstances carves the MIG H100 of the simulated host into
// three 1c.3g.40gb compute instances inside one 3g.40gb GPU instance with
// vgpuctl, checks the refusals, then makes the same layout (and more)
// with a mig-parted file that names compute-instance profiles.
func TestCLIComputeInstances(t *testing.T) {
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{})
	d.ctl(t, "tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited").must(t, "tenant define")

	var made []schemaInstance
	for i := 0; i < 3; i++ {
		in := decodeSchema[docInstance](t, d.ctl(t, "create", "1c.3g.40gb", "--tenant", "acme", "--gpu", sim.DefaultH100MIG, "-o", "json").must(t, "create 1c.3g.40gb")).Instance
		if in.Kind != "mig" || in.MIG == nil || in.MIG.ComputeInstanceSlices != 1 || in.MIG.ComputeInstanceStart != i || in.MIG.GPUInstanceProfileID != 9 {
			t.Fatalf("compute instance %d: %+v %+v", i, in, in.MIG)
		}
		if i > 0 && (in.MIG.GPUInstanceID != made[0].MIG.GPUInstanceID || in.MIG.Start != made[0].MIG.Start) {
			t.Fatalf("compute instance %d in GPU instance %d, the first in %d", i, in.MIG.GPUInstanceID, made[0].MIG.GPUInstanceID)
		}
		made = append(made, in)
	}
	if got := computeLayout(t, d); got != "3g.40gb:3" {
		t.Fatalf("gpus shows %q, want one 3g.40gb with three compute instances", got)
	}
	show := d.ctl(t, "show", made[2].UUID).must(t, "show")
	if !strings.Contains(show.out, "compute slices 2-2") || !strings.Contains(show.out, "1c.3g.40gb") {
		t.Fatalf("show:\n%s", show.out)
	}
	list := d.ctl(t, "list").must(t, "list")
	if strings.Count(list.out, "1c.3g.40gb") != 3 {
		t.Fatalf("list:\n%s", list.out)
	}
	// Refusals, each with its exit code, and the host unchanged.
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"create", "4c.3g.40gb", "--tenant", "acme"}, 2, "unknown profile"},
		{[]string{"create", "2c.1g.10gb", "--tenant", "acme"}, 2, "unknown profile"},
		// 2c starts only at slice 0 of a 3g, taken; the other 3g slot
		// then holds a fourth-to-sixth 1c, and a seventh has no room.
		{[]string{"create", "2c.3g.40gb", "--tenant", "acme", "--gpu", sim.DefaultH100MIG}, 0, ""},
		{[]string{"create", "1c.3g.40gb", "--tenant", "acme", "--gpu", sim.DefaultH100MIG}, 0, ""},
		{[]string{"create", "1c.3g.40gb", "--tenant", "acme", "--gpu", sim.DefaultH100MIG}, 5, "NoCapacity"},
	} {
		r := d.ctl(t, c.args...)
		if r.code != c.code || !strings.Contains(r.err, c.want) {
			t.Fatalf("%v: exit %d, stderr %q; want exit %d with %q", c.args, r.code, r.err, c.code, c.want)
		}
	}
	if got := computeLayout(t, d); got != "3g.40gb:2 3g.40gb:3" {
		t.Fatalf("gpus shows %q, want a 3g.40gb with 2c+1c beside the one with three 1c", got)
	}
	for _, in := range decodeSchema[docList[schemaInstance]](t, d.ctl(t, "list", "-o", "json").must(t, "list")).Items {
		d.ctl(t, "destroy", in.UUID).must(t, "destroy")
	}
	if got := computeLayout(t, d); got != "" {
		t.Fatalf("GPU instances left after destroying every compute instance: %q", got)
	}

	// The same with a mig-parted file: compute-instance profiles, and the
	// whole-GPU-instance spelling 3c.3g.40gb for the other 3g.40gb.
	file := filepath.Join(t.TempDir(), "mig-parted-ci.yaml")
	if err := os.WriteFile(file, []byte(`version: v1
mig-configs:
  gpu0-compute:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "1c.3g.40gb": 3
        "3c.3g.40gb": 1
`), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"apply", "-f", file, "--select", "gpu0-compute@acme"}
	if r := d.ctl(t, args...).must(t, "apply"); !strings.Contains(r.out, "changed:") {
		t.Fatalf("apply:\n%s", r.out)
	}
	if got := computeLayout(t, d); got != "3g.40gb:1 3g.40gb:3" {
		t.Fatalf("after apply gpus shows %q", got)
	}
	if r := d.ctl(t, append(args, "--dry-run")...).must(t, "apply --dry-run again"); !strings.Contains(r.out, "no changes") {
		t.Fatalf("dry run on a host that matches:\n%s", r.out)
	}
	if r := d.ctl(t, args...).must(t, "apply again"); !strings.Contains(r.out, "no changes") {
		t.Fatalf("second apply:\n%s", r.out)
	}
	// Fewer compute instances: one goes, its GPU instance stays.
	if err := os.WriteFile(file, []byte(`version: v1
mig-configs:
  gpu0-compute:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1c.3g.40gb": 2}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	d.ctl(t, args...).must(t, "apply fewer")
	if got := computeLayout(t, d); got != "3g.40gb:2" {
		t.Fatalf("after the smaller apply gpus shows %q", got)
	}
}

// computeLayout is the MIG H100's GPU instances as `gpus` reports them,
// "PROFILE:COMPUTE-INSTANCES" sorted and space-separated.
func computeLayout(t *testing.T, d *busDaemon) string {
	t.Helper()
	var out []string
	for _, g := range decodeSchema[docList[schemaGPU]](t, d.ctl(t, "gpus", "-o", "json").must(t, "gpus")).Items {
		if g.PCI != sim.DefaultH100MIG {
			continue
		}
		for _, gi := range g.MIG.Instances {
			out = append(out, gi.Profile+":"+strconv.Itoa(gi.ComputeInstances))
		}
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}
