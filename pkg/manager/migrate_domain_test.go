package manager_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/virt"
)

// The fake libvirt's halves of an offline move: definitions are
// <domain><name/><uuid/> with mdev hostdevs, as domXML writes them.

func domXML(name, uuid string, mdevs ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "<domain type='kvm'><name>%s</name><uuid>%s</uuid><devices>", name, uuid)
	for _, m := range mdevs {
		fmt.Fprintf(&b, "<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='%s'/></source></hostdev>", m)
	}
	b.WriteString("</devices></domain>")
	return b.String()
}

func (v *migVirt) DestinationXML(_ context.Context, ref string, from, to virt.Hostdev, _ string) (virt.MigrationXML, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	d, err := v.find(ref)
	if err != nil {
		return virt.MigrationXML{}, err
	}
	return virt.MigrationXML{Persistent: domXML(d.name, d.uuid, to.MdevUUID)}, nil
}

func (v *migVirt) DefineMigrated(_ context.Context, doc string) (virt.Domain, error) {
	var def libvirtxml.Domain
	if err := def.Unmarshal(doc); err != nil {
		return virt.Domain{}, fmt.Errorf("%w: %w", virt.ErrBadDestXML, err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	d := &migDom{name: def.Name, uuid: def.UUID}
	for _, h := range def.Devices.Hostdevs {
		d.devs = append(d.devs, virt.Attached{Hostdev: virt.Hostdev{Kind: virt.Mdev, MdevUUID: h.SubsysMDev.Source.Address.UUID}, Config: true})
	}
	v.doms[def.Name] = d
	return virt.Domain{Name: d.name, UUID: d.uuid, Persistent: true}, nil
}

func (v *migVirt) UndefineMigrated(_ context.Context, ref string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if d, ok := v.doms[ref]; ok && d.running {
		return fmt.Errorf("undefine %s: %w", ref, virt.ErrDomainRunning)
	}
	delete(v.doms, ref)
	return nil
}

// setRunning shuts the fake domain off or starts it.
func (v *migVirt) setRunning(name string, on bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.doms[name].running = on
}

func (v *migVirt) has(name string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, ok := v.doms[name]
	return ok
}

// A shut-off VM moves cold: the metadata say so and carry no driver
// metadata, the destination carves without asking the driver (cold only),
// takes only a definition of the VM it prepared for that names its
// device (InvalidArgument otherwise, nothing defined), keeps it while it
// is defined there (an abort is Busy) and gives it back on request once
// the source kept the VM; the source refuses to undefine a VM that runs.
func TestMigrationColdDefinition(t *testing.T) {
	ctx := context.Background()
	src, dst := newMigHost(t, nil), newMigHost(t, nil)
	rec := src.running("A10-4Q")
	if err := src.sim.CloseDevice(rec.MdevUUID); err != nil {
		t.Fatal(err)
	}
	src.v.setRunning(migVM, false)
	md, err := src.m.MigrationSource(ctx, rec.UUID)
	if err != nil || !md.Cold || len(md.VGPU) != 0 {
		t.Fatalf("MigrationSource of a shut-off VM: cold=%v vgpu=%d bytes, %v", md.Cold, len(md.VGPU), err)
	}
	in, err := dst.m.PrepareIncoming(ctx, md, "", "")
	if err != nil || in.Compatibility.VM != gpu.CompatCold || in.Device != rec.MdevUUID {
		t.Fatalf("PrepareIncoming cold: %+v, %v", in, err)
	}
	x, err := src.m.OutgoingDomainXML(ctx, rec.UUID, in.Device)
	if err != nil || !strings.Contains(x.Persistent, in.Device) {
		t.Fatalf("OutgoingDomainXML: %+v, %v", x, err)
	}
	if _, err := src.m.OutgoingDomainXML(ctx, rec.UUID, "0000:81:00.4"); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("OutgoingDomainXML to a VF for an mdev: %v, want InvalidArgument", err)
	}
	for what, doc := range map[string]string{
		"unparsable":        "<domain",
		"another VM":        domXML("web2", "0b6c3f7e-1a2b-4c3d-8e9f-0a1b2c3d4e5f", in.Device),
		"another device":    domXML(migVM, migVMUUID, "11111111-2222-4333-8444-555555555555"),
		"another VM's UUID": domXML(migVM, "0b6c3f7e-1a2b-4c3d-8e9f-0a1b2c3d4e5f", in.Device),
	} {
		if err := dst.m.DefineIncomingDomain(ctx, rec.UUID, doc); !errors.Is(err, manager.ErrInvalidArgument) {
			t.Errorf("define %s: %v, want InvalidArgument", what, err)
		}
		if dst.v.has(migVM) || dst.v.has("web2") {
			t.Fatalf("define %s: the destination defined it", what)
		}
	}
	if err := dst.m.DefineIncomingDomain(ctx, rec.UUID, x.Persistent); err != nil || !dst.v.has(migVM) {
		t.Fatalf("DefineIncomingDomain: %v", err)
	}
	src.v.setRunning(migVM, true)
	if err := src.m.UndefineOutgoingDomain(ctx, rec.UUID); !errors.Is(err, manager.ErrBusy) || !src.v.has(migVM) {
		t.Fatalf("undefine a running VM: %v, want Busy", err)
	}
	src.v.setRunning(migVM, false)
	if err := dst.m.AbortIncoming(ctx, rec.UUID); !errors.Is(err, manager.ErrBusy) || !dst.v.has(migVM) {
		t.Fatalf("abort while the VM is defined here with the device: %v, want Busy", err)
	}
	if err := src.m.CancelOutgoing(ctx, rec.UUID); err != nil || !src.v.has(migVM) {
		t.Fatalf("cancel: %v", err)
	}
	if err := dst.m.UndefineIncomingDomain(ctx, rec.UUID); err != nil || dst.v.has(migVM) {
		t.Fatalf("give back the definition: %v; still defined: %v", err, dst.v.has(migVM))
	}
	if err := dst.m.AbortIncoming(ctx, rec.UUID); err != nil {
		t.Fatalf("abort after the definition was given back: %v", err)
	}
	if err := dst.m.UndefineIncomingDomain(ctx, rec.UUID); !errors.Is(err, manager.ErrConflict) {
		t.Fatalf("give back after the abort: %v, want Conflict", err)
	}
	if a := attachment(t, src.env, rec.UUID); a == nil {
		t.Fatal("the source lost the attachment")
	}
}
