package virt

import (
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// TestHasVFIOHostdev: the pre-check counts mdev and PCI hostdevs in the
// live definition, not USB ones.
func TestHasVFIOHostdev(t *testing.T) {
	for name, c := range map[string]struct {
		h    Hostdev
		want bool
	}{
		"mdev": {Hostdev{Kind: Mdev, MdevUUID: "4b20d080-1b54-4048-85b3-a6a62d165c01"}, true},
		"vf":   {Hostdev{Kind: VF, PCI: "0000:41:00.4"}, true},
		"gpu":  {Hostdev{Kind: Passthrough, PCI: "0000:3b:00.0"}, true},
	} {
		h, err := c.h.normalize()
		if err != nil {
			t.Fatal(err)
		}
		def := &libvirtxml.Domain{Devices: &libvirtxml.DomainDeviceList{Hostdevs: []libvirtxml.DomainHostdev{*domainHostdev(h)}}}
		if got := hasVFIOHostdev(def); got != c.want {
			t.Errorf("%s: hasVFIOHostdev = %v, want %v", name, got, c.want)
		}
	}
	usb := &libvirtxml.Domain{Devices: &libvirtxml.DomainDeviceList{Hostdevs: []libvirtxml.DomainHostdev{{
		SubsysUSB: &libvirtxml.DomainHostdevSubsysUSB{Source: &libvirtxml.DomainHostdevSubsysUSBSource{Address: &libvirtxml.DomainAddressUSB{}}},
	}}}}
	for name, def := range map[string]*libvirtxml.Domain{"usb": usb, "no devices": {}, "shut off": nil} {
		if hasVFIOHostdev(def) {
			t.Errorf("%s: hasVFIOHostdev = true", name)
		}
	}
}

func TestProgressFrom(t *testing.T) {
	u := func(f string, v uint64) libvirt.TypedParam {
		return libvirt.TypedParam{Field: f, Value: *libvirt.NewTypedParamValueUllong(v)}
	}
	p := progressFrom(libvirt.DomainJobUnbounded, []libvirt.TypedParam{
		{Field: libvirt.DomainJobOperationStr, Value: *libvirt.NewTypedParamValueInt(5)},
		u(libvirt.DomainJobTimeElapsed, 1500),
		u(libvirt.DomainJobDataTotal, 100), u(libvirt.DomainJobDataProcessed, 40), u(libvirt.DomainJobDataRemaining, 60),
		u(libvirt.DomainJobMemoryIteration, 2), u(libvirt.DomainJobVfioDataTransferred, 7),
		{Field: "unknown", Value: *libvirt.NewTypedParamValueString("x")},
	})
	want := MigrationProgress{Active: true, Operation: 5, Elapsed: 1500 * time.Millisecond, DataTotal: 100, DataProcessed: 40, DataRemaining: 60, MemoryIteration: 2, VFIOData: 7}
	if p != want {
		t.Fatalf("progressFrom = %+v\nwant %+v", p, want)
	}
	if progressFrom(libvirt.DomainJobCompleted, nil).Active || progressFrom(libvirt.DomainJobNone, nil).Active {
		t.Fatal("a completed or absent job is reported active")
	}
	if !p.Outgoing() || !progressFrom(libvirt.DomainJobBounded, nil).Outgoing() {
		t.Fatal("an outgoing migration job, or an active job of no named operation, is not reported outgoing")
	}
	op := func(o libvirt.DomainJobOperation) []libvirt.TypedParam {
		return []libvirt.TypedParam{{Field: libvirt.DomainJobOperationStr, Value: *libvirt.NewTypedParamValueInt(int32(o))}}
	}
	if progressFrom(libvirt.DomainJobUnbounded, op(libvirt.DomainJobOperationStrSnapshot)).Outgoing() ||
		progressFrom(libvirt.DomainJobCompleted, op(libvirt.DomainJobOperationStrMigrationOut)).Outgoing() {
		t.Fatal("a snapshot job, or a completed migration, is reported outgoing")
	}
}
