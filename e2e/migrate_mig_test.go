package e2e

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// a100 is the PCI address of the A100 of migHost.
const a100 = "0000:c1:00.0"

// migHost writes a simulated host with one A100 whose vGPUs are legacy
// mdevs, in MIG mode or not, and answers the vgpud flags that run it.
func migHost(t *testing.T, mig bool) []string {
	t.Helper()
	mode := "false"
	if mig {
		mode = "true"
	}
	spec := filepath.Join(t.TempDir(), "host.yaml")
	if err := os.WriteFile(spec, []byte("version: v1\ngpus:\n"+
		"  - {model: A100-SXM4-40GB, pci: \""+a100+"\", flavour: mdev, mig: "+mode+"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"--sim-host", spec}
}

// a100GPU is the A100 of a migHost as vgpuctl gpus shows it.
func a100GPU(t *testing.T, d *busDaemon) schemaGPU {
	t.Helper()
	for _, g := range decodeSchema[docList[schemaGPU]](t, d.ctl(t, "gpus", "-o", "json").must(t, "gpus")).Items {
		if g.PCI == a100 {
			return g
		}
	}
	t.Fatalf("gpus lacks %s", a100)
	return schemaGPU{}
}

// A MIG-backed vGPU of the legacy mdev flow (A100X-1-5C, on a GPU
// instance of profile 1g.5gb) moves as the other vGPUs do
// (TestMigrateRunOffline's checks), and the destination carves its GPU
// instance of the source's profile; the source's is released.
func TestMigrateRunMIGBackedMdev(t *testing.T) {
	h := startMigrateHostsOn(t, migHost(t, true), migHost(t, true))
	was, moved := moveOffline(t, h, "A100X-1-5C")
	if was.MIG == nil || moved.MIG == nil || moved.VGPU.Flow != "mdev" {
		t.Fatalf("not a MIG-backed mdev vGPU: source %+v, destination %+v", was, moved)
	}
	if moved.MIG.GPUInstanceProfileID != was.MIG.GPUInstanceProfileID || moved.MIG.Size != was.MIG.Size {
		t.Fatalf("the destination's GPU instance is profile %d of %d slices; the source's was %d of %d",
			moved.MIG.GPUInstanceProfileID, moved.MIG.Size, was.MIG.GPUInstanceProfileID, was.MIG.Size)
	}
	gis := a100GPU(t, h.dst).MIG.Instances
	if len(gis) != 1 || gis[0].ID != moved.MIG.GPUInstanceID || gis[0].ProfileID != was.MIG.GPUInstanceProfileID || gis[0].Profile != "1g.5gb" {
		t.Fatalf("the destination's GPU instances: %+v; its instance is on GPU instance %d", gis, moved.MIG.GPUInstanceID)
	}
	if gis := a100GPU(t, h.src).MIG.Instances; len(gis) != 0 {
		t.Fatalf("the source kept GPU instances: %+v", gis)
	}
}

// A MIG-backed vGPU does not move to a host whose GPU of its type is not
// in MIG mode (another MIG layout): vgpuctl exits 8 (Conflict) naming
// the reason, nothing is carved on the destination, and the VM, its
// instance and its attachment stay on the source, free for another
// operation.
func TestMigrateRunOtherMIGLayoutRefused(t *testing.T) {
	h := startMigrateHostsOn(t, migHost(t, true), migHost(t, false))
	vm := h.srcLV.DefineDomain(t, "vgpud-e2e-layout")
	h.dstLV.RemoveAtCleanup(t, vm)
	in := decodeSchema[docInstance](t, h.src.ctl(t, "create", "A100X-1-5C", "--tenant", "acme", "-o", "json").must(t, "create")).Instance
	h.src.ctl(t, "attach", vm.Name, in.UUID).must(t, "attach")
	srcGPU, dstGPU := a100GPU(t, h.src), a100GPU(t, h.dst)

	r := h.src.ctl(t, "migrate", "run", in.UUID, "--to", h.dst.bus.Address())
	if r.code != 8 || !strings.Contains(r.err, "vgpuctl: Conflict: destination: another MIG layout") {
		t.Fatalf("move to a GPU with MIG off: exit %d, %s", r.code, r.err)
	}
	if got := instances(t, h.dst); len(got) != 0 {
		t.Fatalf("the destination carved: %+v", got)
	}
	if got := a100GPU(t, h.dst); !reflect.DeepEqual(got, dstGPU) {
		t.Fatalf("the destination's GPU changed:\nbefore %+v\nafter  %+v", dstGPU, got)
	}
	if out, err := h.dstLV.VirshErr("dominfo", vm.Name); err == nil {
		t.Fatalf("the VM is defined on the destination:\n%s", out)
	}
	stay := instances(t, h.src)
	if len(stay) != 1 || stay[0].Attachment == nil || stay[0].State != "ready" {
		t.Fatalf("source's instances: %+v", stay)
	}
	if got := a100GPU(t, h.src); !reflect.DeepEqual(got, srcGPU) {
		t.Fatalf("the source's GPU changed:\nbefore %+v\nafter  %+v", srcGPU, got)
	}
	if x := h.srcLV.Virsh(t, "dumpxml", "--inactive", vm.Name); !strings.Contains(x, in.VGPU.MdevUUID) {
		t.Fatalf("the source's domain lost its mdev:\n%s", x)
	}
	checkUsage(t, "source", h.src)
	checkUsage(t, "destination", h.dst)
	// Nothing was begun: the instance is free for another operation.
	h.src.ctl(t, "detach", in.UUID).must(t, "detach after the refusal")
}

// A plain MIG instance (compute only) cannot be attached to a VM, so it
// cannot move with one: `vgpuctl migrate run` refuses it on the source
// (exit 2, InvalidArgument, saying so) before the destination is asked,
// and neither host changes; the instance is free for another operation.
func TestMigrateRunPlainMIGRefused(t *testing.T) {
	h := startMigrateHosts(t)
	in := decodeSchema[docInstance](t, h.src.ctl(t, "create", "1g.10gb", "--tenant", "acme", "-o", "json").must(t, "create")).Instance
	if in.Kind != "mig" {
		t.Fatalf("1g.10gb is a %s instance", in.Kind)
	}
	gpus := func(d *busDaemon) []schemaGPU {
		return decodeSchema[docList[schemaGPU]](t, d.ctl(t, "gpus", "-o", "json").must(t, "gpus")).Items
	}
	srcInst, dstInst, srcGPUs, dstGPUs := instances(t, h.src), instances(t, h.dst), gpus(h.src), gpus(h.dst)

	r := h.src.ctl(t, "migrate", "run", in.UUID, "--to", h.dst.bus.Address())
	if want := "vgpuctl: InvalidArgument: source: instance " + in.UUID + " is a plain MIG instance (compute only): it is attached to no VM"; r.code != 2 || !strings.Contains(r.err, want) {
		t.Fatalf("move of a plain MIG instance: exit %d, %s\nwant exit 2, %s", r.code, r.err, want)
	}
	for _, c := range []struct {
		what          string
		before, after any
	}{
		{"source's instances", srcInst, instances(t, h.src)}, {"destination's instances", dstInst, instances(t, h.dst)},
		{"source's GPUs", srcGPUs, gpus(h.src)}, {"destination's GPUs", dstGPUs, gpus(h.dst)},
	} {
		if !reflect.DeepEqual(c.before, c.after) {
			t.Errorf("the refusal changed the %s:\nbefore %+v\nafter  %+v", c.what, c.before, c.after)
		}
	}
	checkUsage(t, "source", h.src)
	checkUsage(t, "destination", h.dst)
	// Nothing was begun: the instance is free for another operation.
	h.src.ctl(t, "destroy", in.UUID).must(t, "destroy after the refusal")
}
