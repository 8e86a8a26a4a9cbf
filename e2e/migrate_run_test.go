package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/internal/testenv/libvirtd"
)

// migrateHosts is two simulated vgpud hosts, each a vgpud on its own bus
// with its own libvirtd (libvirtd.StartPair), and tenant acme on both.
type migrateHosts struct {
	srcLV, dstLV *libvirtd.Env
	src, dst     *busDaemon
}

func startMigrateHosts(t *testing.T) *migrateHosts {
	t.Helper()
	return startMigrateHostsOn(t, nil, nil)
}

// startMigrateHostsOn is startMigrateHosts with more vgpud flags for the
// source and the destination (--sim-host: other simulated GPUs).
func startMigrateHostsOn(t *testing.T, srcArgs, dstArgs []string) *migrateHosts {
	t.Helper()
	srcLV, dstLV := libvirtd.StartPair(t)
	h := &migrateHosts{srcLV: srcLV, dstLV: dstLV,
		src: startBusDaemon(t, testbus.Start(t), busDaemonOpts{libvirtSocket: srcLV.Socket(), args: srcArgs}),
		dst: startBusDaemon(t, testbus.Start(t), busDaemonOpts{libvirtSocket: dstLV.Socket(), args: dstArgs})}
	for _, d := range []*busDaemon{h.src, h.dst} {
		d.ctl(t, "tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited").must(t, "tenant define")
	}
	return h
}

// instances lists a host's instances.
func instances(t *testing.T, d *busDaemon) []schemaInstance {
	t.Helper()
	return decodeSchema[docList[schemaInstance]](t, d.ctl(t, "list", "-o", "json").must(t, "list")).Items
}

// checkUsage fails unless each tenant's usage on d is the sum of its
// instances there.
func checkUsage(t *testing.T, host string, d *busDaemon) {
	t.Helper()
	type sum struct{ vram, compute, n uint64 }
	want := map[string]sum{}
	for _, in := range instances(t, d) {
		s := want[in.Tenant]
		s.vram, s.compute, s.n = s.vram+in.VRAMBytes, s.compute+in.ComputeMilli, s.n+1
		want[in.Tenant] = s
	}
	for _, tn := range decodeSchema[docList[schemaTenant]](t, d.ctl(t, "tenant", "list", "-o", "json").must(t, "tenant list")).Items {
		w := want[tn.Name]
		if tn.Usage.VRAMBytes != w.vram || tn.Usage.ComputeMilli != w.compute || tn.Usage.Instances != w.n {
			t.Errorf("%s: tenant %s uses %+v; its instances sum to %+v", host, tn.Name, tn.Usage, w)
		}
	}
}

// validateDomain runs virt-xml-validate on a domain's definition.
func validateDomain(t *testing.T, doc string) {
	t.Helper()
	if _, err := exec.LookPath("virt-xml-validate"); err != nil {
		skipMissing(t, "virt-xml-validate not installed (libvirt-clients)")
	}
	f := filepath.Join(t.TempDir(), "domain.xml")
	if err := os.WriteFile(f, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("virt-xml-validate", f, "domain").CombinedOutput(); err != nil {
		t.Fatalf("virt-xml-validate: %v\n%s\n%s", err, out, doc)
	}
}

// A shut-off VM with a vGPU (legacy mdev, vendor-VFIO VF, MIG-backed)
// moves with `vgpuctl migrate run`: afterwards libvirt has it on the
// destination only, its definition names the destination's device and
// validates, the instance and its attachment are the destination's only,
// and each host's tenant usage is the sum of its instances.
func TestMigrateRunOffline(t *testing.T) {
	for _, profile := range []string{"A10-4Q", "L4-4Q", "H100XM-1-10C"} {
		t.Run(profile, func(t *testing.T) { migrateRunOffline(t, profile) })
	}
}

func migrateRunOffline(t *testing.T, profile string) {
	moveOffline(t, startMigrateHosts(t), profile)
}

// moveOffline moves a shut-off VM with an instance of profile from h's
// source to its destination with `vgpuctl migrate run`, checks the move
// (TestMigrateRunOffline) and answers the source's instance and the
// destination's.
func moveOffline(t *testing.T, h *migrateHosts, profile string) (was, moved schemaInstance) {
	t.Helper()
	vm := h.srcLV.DefineDomain(t, "vgpud-e2e-move")
	h.dstLV.RemoveAtCleanup(t, vm)
	in := decodeSchema[docInstance](t, h.src.ctl(t, "create", profile, "--tenant", "acme", "-o", "json").must(t, "create")).Instance
	h.src.ctl(t, "attach", vm.Name, in.UUID).must(t, "attach")

	r := h.src.ctl(t, "migrate", "run", in.UUID, "--to", h.dst.bus.Address()).must(t, "migrate run")
	if !strings.Contains(r.out, "moved VM "+vm.Name) {
		t.Fatalf("migrate run printed %q", r.out)
	}

	if out, err := h.srcLV.VirshErr("dominfo", vm.Name); err == nil {
		t.Fatalf("the VM is still defined on the source:\n%s", out)
	}
	x := h.dstLV.Virsh(t, "dumpxml", "--inactive", vm.Name)
	if !strings.Contains(x, vm.UUID) {
		t.Fatalf("the destination's domain is another VM:\n%s", x)
	}
	there := instances(t, h.dst)
	if len(there) != 1 || there[0].UUID != in.UUID || there[0].Profile != in.Profile || there[0].Attachment == nil || there[0].Attachment.VMUUID != vm.UUID || there[0].VGPU == nil {
		t.Fatalf("destination's instances: %+v", there)
	}
	if want := hostdevNames(there[0]); !strings.Contains(x, want) {
		t.Fatalf("the destination's domain does not name its device %s:\n%s", want, x)
	}
	validateDomain(t, x)
	if left := instances(t, h.src); len(left) != 0 {
		t.Fatalf("the source kept instances: %+v", left)
	}
	checkUsage(t, "source", h.src)
	checkUsage(t, "destination", h.dst)
	return in, there[0]
}

// hostdevNames is how a domain's XML names an instance's device: an
// mdev's UUID, or a VF's PCI address as libvirt writes it.
func hostdevNames(in schemaInstance) string {
	if in.VGPU.MdevUUID != "" {
		return in.VGPU.MdevUUID
	}
	var dom, bus, slot, fn uint
	if _, err := fmt.Sscanf(in.VGPU.VF, "%x:%x:%x.%x", &dom, &bus, &slot, &fn); err != nil {
		return "unparsable VF " + in.VGPU.VF
	}
	return fmt.Sprintf("domain='0x%04x' bus='0x%02x' slot='0x%02x' function='0x%x'", dom, bus, slot, fn)
}

// A move the destination refuses (its tenant is missing there) carves
// nothing there and leaves the VM, its instance and its attachment on the
// source, free to move again (the retry names the VM).
func TestMigrateRunRefusedStays(t *testing.T) {
	h := startMigrateHosts(t)
	vm := h.srcLV.DefineDomain(t, "vgpud-e2e-stay")
	h.dstLV.RemoveAtCleanup(t, vm)
	h.src.ctl(t, "tenant", "define", "beta", "--vram", "unlimited", "--compute", "unlimited").must(t, "tenant define beta")
	in := decodeSchema[docInstance](t, h.src.ctl(t, "create", "A10-4Q", "--tenant", "beta", "-o", "json").must(t, "create")).Instance
	h.src.ctl(t, "attach", vm.Name, in.UUID).must(t, "attach")

	if r := h.src.ctl(t, "migrate", "run", in.UUID, "--to", h.dst.bus.Address()); r.code != 4 || !strings.Contains(r.err, "beta") {
		t.Fatalf("move for a tenant the destination lacks: exit %d, %s", r.code, r.err)
	}
	if got := instances(t, h.dst); len(got) != 0 {
		t.Fatalf("the destination carved: %+v", got)
	}
	if out, err := h.dstLV.VirshErr("dominfo", vm.Name); err == nil {
		t.Fatalf("the VM is defined on the destination:\n%s", out)
	}
	stay := instances(t, h.src)
	if len(stay) != 1 || stay[0].Attachment == nil || stay[0].State != "ready" {
		t.Fatalf("source's instances: %+v", stay)
	}
	if x := h.srcLV.Virsh(t, "dumpxml", "--inactive", vm.Name); !strings.Contains(x, in.VGPU.MdevUUID) {
		t.Fatalf("the source's domain lost its mdev:\n%s", x)
	}
	h.dst.ctl(t, "tenant", "define", "beta", "--vram", "unlimited", "--compute", "unlimited").must(t, "tenant define beta there")
	h.src.ctl(t, "migrate", "run", vm.Name, "--to", h.dst.bus.Address()).must(t, "migrate run again, naming the VM")
	if moved := instances(t, h.dst); len(moved) != 1 || moved[0].UUID != in.UUID || moved[0].Tenant != "beta" {
		t.Fatalf("destination's instances after the retry: %+v", moved)
	}
	checkUsage(t, "source", h.src)
	checkUsage(t, "destination", h.dst)
}

// migrate run --live checks before anything is carved on the destination:
// a VM that is shut off is refused there (it moves offline), and the VM,
// its instance and its attachment stay on the source with nothing left on
// the destination. (No guest here holds a vGPU while it runs, so the
// version refusal itself is TestPrecheckOutgoingLive's and
// TestMigrateRunLive's.)
func TestMigrateRunLiveRefusedFirst(t *testing.T) {
	h := startMigrateHosts(t)
	vm := h.srcLV.DefineDomain(t, "vgpud-e2e-live")
	h.dstLV.RemoveAtCleanup(t, vm)
	in := decodeSchema[docInstance](t, h.src.ctl(t, "create", "A10-4Q", "--tenant", "acme", "-o", "json").must(t, "create")).Instance
	h.src.ctl(t, "attach", vm.Name, in.UUID).must(t, "attach")
	r := h.src.ctl(t, "migrate", "run", in.UUID, "--to", h.dst.bus.Address(), "--live", "--dest-uri", h.dstLV.PeerURI(), "--migrate-uri", libvirtd.MigrateURI(t))
	if r.code != 8 || !strings.Contains(r.err, "is shut off: move it without --live") {
		t.Fatalf("--live of a shut-off VM: exit %d, %s", r.code, r.err)
	}
	if got := instances(t, h.dst); len(got) != 0 {
		t.Fatalf("the destination carved: %+v", got)
	}
	stay := instances(t, h.src)
	if len(stay) != 1 || stay[0].Attachment == nil || stay[0].State != "ready" {
		t.Fatalf("source's instances: %+v", stay)
	}
	// Nothing was begun: the instance is free for another operation.
	h.src.ctl(t, "detach", in.UUID).must(t, "detach after the refusal")
}
