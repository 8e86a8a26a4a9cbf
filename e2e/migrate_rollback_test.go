package e2e

import (
	"reflect"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/internal/invariant"
)

// A move that fails after the destination defined the VM (the source's
// libvirt refuses to undefine a domain that has snapshots: Conflict, exit
// 8, naming them) is rolled back: the VM is defined on the source only, with its original
// definition, the destination's instance is released, neither host keeps
// an intent, and each host's instances, attachments and tenant usage are
// as before. With the snapshot gone the VM moves.
func TestMigrateRunRollsBackAfterDefine(t *testing.T) {
	h := startMigrateHosts(t)
	vm := h.srcLV.DefineDomain(t, "vgpud-e2e-rollback")
	h.dstLV.RemoveAtCleanup(t, vm)
	in := decodeSchema[docInstance](t, h.src.ctl(t, "create", "A10-4Q", "--tenant", "acme", "-o", "json").must(t, "create")).Instance
	h.src.ctl(t, "attach", vm.Name, in.UUID).must(t, "attach")
	drop := h.srcLV.SnapshotDomain(t, vm.Name)
	tenants := func(d *busDaemon) []schemaTenant {
		return decodeSchema[docList[schemaTenant]](t, d.ctl(t, "tenant", "list", "-o", "json").must(t, "tenant list")).Items
	}
	srcXML := h.srcLV.Virsh(t, "dumpxml", "--inactive", vm.Name)
	srcInst, dstInst, srcTenants, dstTenants := instances(t, h.src), instances(t, h.dst), tenants(h.src), tenants(h.dst)

	r := h.src.ctl(t, "migrate", "run", in.UUID, "--to", h.dst.bus.Address())
	if r.code != 8 || !strings.Contains(r.err, "vgpuctl: Conflict: source: undefine VM "+vm.Name+": ") || !strings.Contains(r.err, "snapshots") {
		t.Fatalf("move whose source cannot undefine the VM: exit %d, %s", r.code, r.err)
	}
	t.Logf("migrate run: exit %d, %s", r.code, r.err)
	if !strings.Contains(h.dst.log(), "migration: VM defined here") {
		t.Fatalf("the move failed before the destination defined the VM: %s", r.err)
	}
	if out, err := h.dstLV.VirshErr("dominfo", vm.Name); err == nil {
		t.Fatalf("the VM is still defined on the destination:\n%s", out)
	}
	if x := h.srcLV.Virsh(t, "dumpxml", "--inactive", vm.Name); x != srcXML {
		t.Fatalf("the source's definition changed:\nbefore:\n%s\nafter:\n%s", srcXML, x)
	}
	for _, c := range []struct {
		what          string
		before, after any
	}{
		{"source's instances", srcInst, instances(t, h.src)}, {"destination's instances", dstInst, instances(t, h.dst)},
		{"source's tenants", srcTenants, tenants(h.src)}, {"destination's tenants", dstTenants, tenants(h.dst)},
	} {
		if !reflect.DeepEqual(c.before, c.after) {
			t.Errorf("the rollback changed the %s:\nbefore %+v\nafter  %+v", c.what, c.before, c.after)
		}
	}
	checkUsage(t, "source", h.src)
	checkUsage(t, "destination", h.dst)
	noIntentsNorLeaks(t, h)

	// Nothing is left of the move: with the snapshot gone the VM moves.
	h.src = startBusDaemon(t, h.src.bus, busDaemonOpts{libvirtSocket: h.srcLV.Socket(), stateDir: h.src.stateDir})
	h.dst = startBusDaemon(t, h.dst.bus, busDaemonOpts{libvirtSocket: h.dstLV.Socket(), stateDir: h.dst.stateDir})
	drop()
	h.src.ctl(t, "migrate", "run", vm.Name, "--to", h.dst.bus.Address()).must(t, "migrate run without the snapshot")
	if moved := instances(t, h.dst); len(moved) != 1 || moved[0].UUID != in.UUID || moved[0].Attachment == nil {
		t.Fatalf("destination's instances after the retry: %+v", moved)
	}
}

// noIntentsNorLeaks stops both of h's vgpuds and checks that neither
// state keeps an intent and that every device of each simulated host has
// its record and every record its device.
func noIntentsNorLeaks(t *testing.T, h *migrateHosts) {
	t.Helper()
	for _, x := range []struct {
		name string
		d    *busDaemon
	}{{"source", h.src}, {"destination", h.dst}} {
		x.d.stop(t)
		st := readState(t, x.d.stateDir)
		for _, it := range st.intents {
			t.Errorf("%s: intent %s (%s %s) left", x.name, it.ID, it.Op, it.Instance)
		}
		extra, missing := invariant.HostDiff(simInventory(t, x.d.stateDir), st.instances)
		for _, e := range extra {
			t.Errorf("%s: leak: %s", x.name, e)
		}
		for _, m := range missing {
			t.Errorf("%s: lost: %s", x.name, m)
		}
	}
}
