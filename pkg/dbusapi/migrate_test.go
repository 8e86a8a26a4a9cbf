package dbusapi

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/virt"
)

// hostVirt is one host's libvirt: its domains and the hostdevs they hold.
type hostVirt struct {
	mu   sync.Mutex
	doms map[string]*hostDom
}

type hostDom struct {
	uuid string
	devs []virt.Attached
}

// find looks a domain up by name, as libvirt's lookup does.
func (v *hostVirt) find(ref string) (string, *hostDom, error) {
	if d, ok := v.doms[ref]; ok {
		return ref, d, nil
	}
	return "", nil, fmt.Errorf("domain %s: %w", ref, virt.ErrDomainNotFound)
}

func (v *hostVirt) define(name, uuid string, devs ...virt.Attached) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.doms[name] = &hostDom{uuid: uuid, devs: devs}
}

func (v *hostVirt) undefine(name string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.doms, name)
}

func (v *hostVirt) URI() string { return "qemu:///system" }
func (v *hostVirt) Domain(_ context.Context, ref string) (virt.Domain, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	n, d, err := v.find(ref)
	if err != nil {
		return virt.Domain{}, err
	}
	return virt.Domain{Name: n, UUID: d.uuid, Running: true, Persistent: true}, nil
}
func (v *hostVirt) Attach(_ context.Context, ref string, h virt.Hostdev, instance string) (bool, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, d, err := v.find(ref)
	if err != nil {
		return false, err
	}
	d.devs = append(d.devs, virt.Attached{Instance: instance, Hostdev: h, Config: true, Live: true, MetadataConfig: true, MetadataLive: true})
	return true, nil
}
func (v *hostVirt) Detach(context.Context, string, virt.Hostdev, string) error { return nil }
func (v *hostVirt) Attached(_ context.Context, ref string) ([]virt.Attached, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, d, err := v.find(ref)
	if err != nil {
		return nil, err
	}
	return slices.Clone(d.devs), nil
}
func (v *hostVirt) Domains(context.Context) ([]virt.Domain, error) { return nil, nil }
func (v *hostVirt) Events(context.Context) <-chan virt.Event       { return nil }
func (v *hostVirt) Quiesce(context.Context) error                  { return nil }

// TestDBusMigration: a VM moves between two daemons through their
// clients: the source's metadata carried to the destination, which
// answers the device the VM names there; the destination records the
// VM's attachment and the source releases its instance. A refusal keeps
// its name across the bus.
func TestDBusMigration(t *testing.T) {
	ctx := ctxT(t)
	const vm, vmUUID = "web1", "8c0f6a3e-2d1b-4e5f-9a7c-6b5d4e3f2a10"
	src, dst := newEnv(t, testbus.Options{}, nil), newEnv(t, testbus.Options{}, nil)
	sv, dv := &hostVirt{doms: map[string]*hostDom{}}, &hostVirt{doms: map[string]*hostDom{}}
	src.m.SetVirt(sv)
	dst.m.SetVirt(dv)
	for _, e := range []*env{src, dst} {
		e.tenant("acme", unlimitedQuota())
	}
	dst.tenant("tight", Quota{VRAMBytes: Unlimited, ComputeMilli: Unlimited, MaxInstances: 0})
	sv.define(vm, vmUUID)
	inst := src.create("acme", "L4-4Q", "")
	if _, err := src.client.Attach(ctx, inst.UUID, vm, AttachOptions{}); err != nil {
		t.Fatal(err)
	}
	rec, err := src.m.Instance(inst.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.sim.OpenDevice(rec.VF, vmUUID, vm); err != nil {
		t.Fatal(err)
	}
	md, err := src.client.MigrationSource(ctx, inst.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dst.client.PrepareIncoming(ctx, "{", "", ""); ErrorName(err) != NameInvalidArgument {
		t.Fatalf("metadata that are not JSON: %v, want InvalidArgument", err)
	}
	if _, err := dst.client.PrepareIncoming(ctx, md+" {}", "", ""); ErrorName(err) != NameInvalidArgument {
		t.Fatalf("metadata with more after the document: %v, want InvalidArgument", err)
	}
	if _, err := dst.client.PrepareIncoming(ctx, md, "", "tight"); ErrorName(err) != NameQuotaExceeded {
		t.Fatalf("a tenant without room in its quota: %v, want QuotaExceeded", err)
	}
	in, err := dst.client.PrepareIncoming(ctx, md, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if in.Instance != inst.UUID || in.Device == "" || in.VMCompatibility&8 == 0 || in.CompatibilityLimit != 0 {
		t.Fatalf("incoming %+v", in)
	}
	dv.define(vm, vmUUID, virt.Attached{Instance: in.Instance, Hostdev: virt.Hostdev{Kind: virt.VF, PCI: in.Device}, Config: true, Live: true})
	sv.undefine(vm)
	if err := src.sim.CloseDevice(rec.VF); err != nil {
		t.Fatal(err)
	}
	a, err := dst.client.CommitIncoming(ctx, in.Instance)
	if err != nil || a.VMUUID != vmUUID || !a.Live {
		t.Fatalf("commit: %+v %v", a, err)
	}
	if err := src.client.CompleteOutgoing(ctx, inst.UUID); err != nil {
		t.Fatal(err)
	}
	if _, err := src.client.Instance(ctx, inst.UUID); ErrorName(err) != NameNotFound {
		t.Fatalf("the source's instance after the move: %v", err)
	}
	got, err := dst.client.Instance(ctx, inst.UUID)
	if err != nil || got.Attachment == nil || got.Attachment.VM != vm || got.State != string(store.StateReady) {
		t.Fatalf("the destination's instance: %+v %v", got, err)
	}
}
