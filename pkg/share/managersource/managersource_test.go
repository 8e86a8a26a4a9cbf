package managersource

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/share"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
	"github.com/vgpud/vgpud/profiles"
)

// fakeManager answers with fixed records, or fails with err.
type fakeManager struct {
	gpus    []manager.GPUView
	insts   []manager.InstanceView
	tenants []manager.TenantView
	err     error
}

func (f *fakeManager) GPUs() ([]manager.GPUView, error)              { return f.gpus, f.err }
func (f *fakeManager) AllInstances() ([]manager.InstanceView, error) { return f.insts, f.err }
func (f *fakeManager) Tenants() ([]manager.TenantView, error)        { return f.tenants, f.err }

func catalog(t *testing.T) func() *profile.Catalog {
	t.Helper()
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	return func() *profile.Catalog { return cat }
}

func tenantView(name string, class tenant.Class) manager.TenantView {
	return manager.TenantView{Tenant: store.Tenant{Tenant: tenant.Tenant{Name: name, Class: class}}}
}

// Each record becomes its share type: a tenant's class marks its instances
// guaranteed, an instance's kind says how it shares its GPU (a time-sliced
// vGPU has no GPU instance), an attachment names the VM, and a MIG GPU's
// slots come from the catalog.
func TestInventory(t *testing.T) {
	m := &fakeManager{
		gpus: []manager.GPUView{
			{GPU: gpu.GPU{UUID: "GPU-a", PCI: "0000:41:00.0", Model: "H100-SXM5-80GB", Product: "NVIDIA H100 80GB HBM3",
				MIG: gpu.MIG{Enabled: true}, VGPU: gpu.VGPU{Flavour: gpu.FlavourVFIO}}, State: "ok"},
			{GPU: gpu.GPU{Index: 1, UUID: "GPU-b", PCI: "0000:61:00.0", Model: "L40S-48GB", VGPU: gpu.VGPU{Flavour: gpu.FlavourVFIO}}, State: "failed"},
			{GPU: gpu.GPU{Index: 2, UUID: "GPU-c", PCI: "0000:81:00.0", Model: "not-in-catalog"}, State: "lost"},
		},
		insts: []manager.InstanceView{
			{Instance: store.Instance{UUID: "i-mig", Tenant: "gold", Kind: store.KindMIG, GPUUUID: "GPU-a", Profile: "3g.40gb",
				GIID: 2, GIStart: 4, GISize: 4, ComputeMilli: 428, VRAMBytes: 40 << 30, State: store.StateReady}},
			{Instance: store.Instance{UUID: "i-migvgpu", Tenant: "gold", Kind: store.KindMIGVGPU, GPUUUID: "GPU-a", Profile: "H100-1-10C",
				GIID: 5, GIStart: 0, GISize: 1, TypeID: 1050, VF: "0000:41:00.4", State: store.StateReady}},
			{Instance: store.Instance{UUID: "i-ts", Tenant: "free", Kind: store.KindVGPU, GPUUUID: "GPU-b", Profile: "L40S-8Q",
				GIID: 7, TypeID: 1001, MdevUUID: "m-1", ComputeMilli: 166, State: store.StateReady},
				Attachment: &store.Attachment{Domain: "vm1", DomainUUID: "d-1"}},
			{Instance: store.Instance{UUID: "i-pt", Tenant: "nobody", Kind: store.KindPassthrough, GPUUUID: "GPU-c", State: store.StateFailed}},
		},
		tenants: []manager.TenantView{tenantView("gold", tenant.Guaranteed), tenantView("free", tenant.BestEffort)},
	}
	got, err := New(m, catalog(t)).Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := share.Inventory{
		GPUs: []share.GPU{
			{UUID: "GPU-a", PCI: "0000:41:00.0", Model: "H100-SXM5-80GB", Product: "NVIDIA H100 80GB HBM3", MIG: true, Flavour: "vfio", State: "ok", MIGSlots: 8},
			{Index: 1, UUID: "GPU-b", PCI: "0000:61:00.0", Model: "L40S-48GB", Flavour: "vfio", State: "failed"},
			{Index: 2, UUID: "GPU-c", PCI: "0000:81:00.0", Model: "not-in-catalog", State: "lost"},
		},
		Instances: []share.Instance{
			{UUID: "i-mig", Tenant: "gold", Guaranteed: true, GPU: "GPU-a", Kind: share.MIG, RecordKind: "mig", Profile: "3g.40gb",
				GI: 2, GIStart: 4, GISize: 4, ComputeMilli: 428, VRAMBytes: 40 << 30, State: "ready"},
			{UUID: "i-migvgpu", Tenant: "gold", Guaranteed: true, GPU: "GPU-a", Kind: share.MIG, RecordKind: "mig-vgpu", Profile: "H100-1-10C",
				VF: "0000:41:00.4", GI: 5, GIStart: 0, GISize: 1, TypeID: 1050, State: "ready"},
			{UUID: "i-ts", Tenant: "free", GPU: "GPU-b", Kind: share.TimeSliced, RecordKind: "vgpu", Profile: "L40S-8Q", VM: "vm1", VMUUID: "d-1",
				MdevUUID: "m-1", GI: -1, TypeID: 1001, ComputeMilli: 166, State: "ready"},
			{UUID: "i-pt", Tenant: "nobody", GPU: "GPU-c", Kind: share.Passthrough, RecordKind: "passthrough", State: "failed"},
		},
		Tenants: []share.Tenant{{Name: "gold", Guaranteed: true}, {Name: "free"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Inventory =\n%+v\nwant\n%+v", got, want)
	}
}

// A manager that fails, or a ctx that ended, is an error, not an empty
// inventory (which would read as "no instances").
func TestInventoryErrors(t *testing.T) {
	errDB := errors.New("store unreadable")
	if _, err := New(&fakeManager{err: errDB}, catalog(t)).Inventory(context.Background()); !errors.Is(err, errDB) {
		t.Fatalf("failing manager: %v, want %v", err, errDB)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := New(&fakeManager{}, catalog(t)).Inventory(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("ended ctx: %v, want context.Canceled", err)
	}
}
