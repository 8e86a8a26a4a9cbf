package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/vgpud/vgpud/pkg/dbusapi"
)

var (
	t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f1 = 250.0
	f2 = 0.125
)

// fake is a vgpud with fixed state that records what it was asked.
type fake struct {
	mu    sync.Mutex
	calls []string
	// fail makes every call fail with this error.
	fail error
	// failCall makes the calls of this method fail (Conflict); "A|B"
	// names more than one.
	failCall string
	// failDestroy makes the destroy of this instance fail (Busy).
	failDestroy string
	// defined is the last DefineTenant spec.
	defined dbusapi.TenantSpec
	quota   dbusapi.Quota
	// applyNothing makes Apply find the host as the file describes it;
	// applySummary is then its summary (skipped entries, warnings).
	applyNothing bool
	applySummary string
	// created is the last Create request.
	created dbusapi.CreateRequest
	// held, when set, is the scheduler GPU reports for every GPU (what
	// the daemon holds after a pin).
	held *dbusapi.GPUSchedulerState
	// giScheds, when set, are the GPU instance schedulers GPU reports for
	// every GPU.
	giScheds []dbusapi.GPUInstanceScheduler
	// behind is what creates and destroys left Placement behind on.
	behind string
}

func (f *fake) record(format string, args ...any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := fmt.Sprintf(format, args...)
	f.calls = append(f.calls, c)
	for _, m := range strings.Split(f.failCall, "|") {
		if m != "" && strings.HasPrefix(c, m+" ") {
			return &dbusapi.Error{Name: dbusapi.NameConflict, Message: m + " refused"}
		}
	}
	return f.fail
}

func (f *fake) lastCall() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return ""
	}
	return f.calls[len(f.calls)-1]
}

func fakeGPUs() []dbusapi.GPU {
	return []dbusapi.GPU{
		{PCI: "0000:41:00.0", UUID: "GPU-11111111-2222-3333-4444-555555555555", Index: 0, Model: "H100-SXM5-80GB", Product: "NVIDIA H100 80GB HBM3",
			MemoryBytes: 80 << 30, NUMANode: 0, KernelDriver: "nvidia", State: "ok",
			MIG:       dbusapi.GPUMIG{Capable: true, Enabled: true, Pending: true, Instances: []dbusapi.GPUInstance{{ID: 1, ProfileID: 9, Profile: "3g.40gb", Start: 4, Size: 4, ComputeInstances: 1}}},
			VGPU:      dbusapi.GPUVGPU{Flavour: "vfio", TotalVFs: 16, NumVFs: 16},
			Instances: []string{"0b4f5c1e-9a3d-4e2b-8c7f-1a2b3c4d5e6f"}},
		{PCI: "0000:81:00.0", UUID: "GPU-66666666-7777-8888-9999-000000000000", Index: 1, Model: "L4-24GB", Product: "NVIDIA L4",
			MemoryBytes: 24 << 30, NUMANode: 1, KernelDriver: "nvidia", State: "failed", Reason: "XID 79",
			MIG: dbusapi.GPUMIG{Instances: []dbusapi.GPUInstance{}}, VGPU: dbusapi.GPUVGPU{Flavour: "vfio", TotalVFs: 32, NumVFs: 32},
			Instances: []string{"7d2e9f10-4b5a-4c6d-9e8f-0a1b2c3d4e5f"}},
	}
}

func fakeInstances() []dbusapi.Instance {
	return []dbusapi.Instance{
		{UUID: "0b4f5c1e-9a3d-4e2b-8c7f-1a2b3c4d5e6f", Tenant: "acme", Kind: "mig", Profile: "3g.40gb", Model: "H100-SXM5-80GB",
			GPU: "0000:41:00.0", GPUUUID: "GPU-11111111-2222-3333-4444-555555555555",
			MIG:       &dbusapi.InstanceMIG{GPUInstanceProfileID: 9, Start: 4, Size: 4, GPUInstanceID: 1, ComputeInstanceID: 0},
			VRAMBytes: 40 << 30, ComputeMilli: 375, State: "ready", Reason: "keeps 7g.80gb's room", Created: t0, Updated: t0},
		{UUID: "7d2e9f10-4b5a-4c6d-9e8f-0a1b2c3d4e5f", Tenant: "a-tenant-with-a-rather-long-name", Kind: "vgpu", Profile: "L4-4Q", Model: "L4-24GB",
			GPU: "0000:81:00.0", GPUUUID: "GPU-66666666-7777-8888-9999-000000000000",
			VGPU:      &dbusapi.InstanceVGPU{TypeID: 803, Type: "L4-4Q", Flow: "vfio", VF: "0000:81:00.4"},
			VRAMBytes: 4 << 30, ComputeMilli: 166, State: "ready", Created: t0, Updated: t0.Add(time.Minute),
			Attachment: &dbusapi.Attachment{VM: "a-virtual-machine-named-at-length", VMUUID: "5f0c2a1e-0000-4000-8000-000000000001", URI: "qemu:///system", Live: true, Since: t0.Add(2 * time.Minute)}},
	}
}

func fakeTenants() []dbusapi.Tenant {
	return []dbusapi.Tenant{
		{Name: "a-tenant-with-a-rather-long-name", Class: "best-effort",
			Quota:         dbusapi.Quota{VRAMBytes: dbusapi.Unlimited, ComputeMilli: dbusapi.Unlimited, MaxInstances: dbusapi.Unlimited},
			Usage:         dbusapi.Usage{VRAMBytes: 4 << 30, ComputeMilli: 166, Instances: 1},
			AllowedModels: []string{}, AllowedProfiles: []string{}, Instances: []string{"7d2e9f10-4b5a-4c6d-9e8f-0a1b2c3d4e5f"}, Created: t0},
		{Name: "acme", Class: "guaranteed",
			Quota:         dbusapi.Quota{VRAMBytes: 80 << 30, ComputeMilli: 2500, MaxInstances: 4},
			Usage:         dbusapi.Usage{VRAMBytes: 40 << 30, ComputeMilli: 375, Instances: 1},
			AllowedModels: []string{"H100-SXM5-80GB"}, AllowedProfiles: []string{}, Instances: []string{"0b4f5c1e-9a3d-4e2b-8c7f-1a2b3c4d5e6f"}, Created: t0},
	}
}

func (f *fake) Close() error { return nil }

func (f *fake) Version(context.Context) (string, error) { return "1.2.3", f.record("Version") }

func (f *fake) Status(context.Context) (dbusapi.Status, error) {
	return dbusapi.Status{Version: "1.2.3", DriverVersion: "580.65.05", GPUs: 2, Instances: 2, Tenants: 2}, f.record("Status")
}

func (f *fake) Objects(context.Context) (dbusapi.Objects, error) {
	return dbusapi.Objects{GPUs: fakeGPUs(), Instances: fakeInstances(), Tenants: fakeTenants()}, f.record("Objects")
}

func (f *fake) GPU(_ context.Context, id string) (dbusapi.GPU, error) {
	if err := f.record("GPU %s", id); err != nil {
		return dbusapi.GPU{}, err
	}
	for _, g := range fakeGPUs() {
		if g.PCI == id {
			if f.held != nil {
				g.Scheduler = f.held
			}
			if f.giScheds != nil {
				g.GPUInstanceSchedulers = f.giScheds
			}
			return g, nil
		}
	}
	return dbusapi.GPU{}, &dbusapi.Error{Name: dbusapi.NameNotFound, Message: "no GPU " + id}
}

func (f *fake) Instances(_ context.Context, tenant string) ([]dbusapi.Instance, error) {
	var out []dbusapi.Instance
	for _, in := range fakeInstances() {
		if tenant == "" || in.Tenant == tenant {
			out = append(out, in)
		}
	}
	return out, f.record("Instances %s", tenant)
}

func (f *fake) Instance(_ context.Context, id string) (dbusapi.Instance, error) {
	if err := f.record("Instance %s", id); err != nil {
		return dbusapi.Instance{}, err
	}
	for _, in := range fakeInstances() {
		if in.UUID == id {
			return in, nil
		}
	}
	return dbusapi.Instance{}, &dbusapi.Error{Name: dbusapi.NameNotFound, Message: "no instance " + id + " (run `vgpuctl list`)"}
}

func (f *fake) Tenants(context.Context) ([]dbusapi.Tenant, error) {
	return fakeTenants(), f.record("Tenants")
}

func (f *fake) Tenant(_ context.Context, name string) (dbusapi.Tenant, error) {
	if err := f.record("Tenant %s", name); err != nil {
		return dbusapi.Tenant{}, err
	}
	for _, t := range fakeTenants() {
		if t.Name == name {
			return t, nil
		}
	}
	return dbusapi.Tenant{}, &dbusapi.Error{Name: dbusapi.NameNotFound, Message: "no tenant " + name + " (run `vgpuctl tenant list`)"}
}

func (f *fake) Profiles(_ context.Context, gpu string) ([]dbusapi.Profile, error) {
	return []dbusapi.Profile{
		{Model: "H100-SXM5-80GB", Name: "3g.40gb", Kind: "mig", VRAMBytes: 40 << 30, ComputeMilli: 375, MaxPerGPU: 2, Flows: []string{}},
		{Model: "H100-SXM5-80GB", Name: "H100XM-2-20C", Kind: "mig-vgpu", VRAMBytes: 20 << 30, ComputeMilli: 250, MaxPerGPU: 3, Flows: []string{"vfio"}},
		{Model: "L4-24GB", Name: "L4-4Q", Kind: "vgpu", VRAMBytes: 4 << 30, ComputeMilli: 166, MaxPerGPU: 6, Flows: []string{"vfio"}},
		{Model: "L4-24GB", Name: "passthrough", Kind: "passthrough", VRAMBytes: 24 << 30, ComputeMilli: 1000, MaxPerGPU: 1, Flows: []string{}},
	}, f.record("Profiles %s", gpu)
}

func fakeCapacity() []dbusapi.Capacity {
	return []dbusapi.Capacity{
		{Model: "H100-SXM5-80GB", Profile: "3g.40gb", Kind: "mig", Count: 1, GPUs: 1},
		{Model: "H100-SXM5-80GB", Profile: "7g.80gb", Kind: "mig", Count: 0, GPUs: 0},
		{Model: "L4-24GB", Profile: "L4-4Q", Kind: "vgpu", Count: 5, GPUs: 1},
	}
}

func (f *fake) Capacity(context.Context) ([]dbusapi.Capacity, error) {
	return fakeCapacity(), f.record("Capacity")
}

func (f *fake) Plan(_ context.Context, r dbusapi.PlanRequest) (dbusapi.Plan, error) {
	return dbusapi.Plan{Tenant: r.Tenant, Profile: r.Profile, Fits: true, Model: "H100-SXM5-80GB", GPU: "0000:41:00.0",
		GPUUUID: "GPU-11111111-2222-3333-4444-555555555555", Start: 0, VRAMBytes: 40 << 30, ComputeMilli: 375,
		Reason: "keeps 4g.40gb creatable", QuotaOK: true, Moves: []dbusapi.Move{}, FreeAfter: fakeCapacity()}, f.record("Plan %s %s %s", r.Tenant, r.Profile, r.GPU)
}

func (f *fake) Create(_ context.Context, r dbusapi.CreateRequest) (dbusapi.Instance, error) {
	f.mu.Lock()
	f.created = r
	f.mu.Unlock()
	in := fakeInstances()[0]
	in.PlacementBehind = f.behind
	return in, f.record("Create %s %s %s", r.Tenant, r.Profile, r.GPU)
}

func (f *fake) DestroyBehind(_ context.Context, id string, detach bool) (string, error) {
	if err := f.record("Destroy %s %v", id, detach); err != nil {
		return "", err
	}
	if id == f.failDestroy {
		return "", &dbusapi.Error{Name: dbusapi.NameBusy, Message: "instance " + id + " is attached; detach it first or give --detach"}
	}
	return f.behind, nil
}

func (f *fake) Attach(_ context.Context, id, vm string, o dbusapi.AttachOptions) (dbusapi.Instance, error) {
	return fakeInstances()[1], f.record("Attach %s %s %v", id, vm, o.Display)
}

func (f *fake) CreateAndAttach(_ context.Context, r dbusapi.CreateRequest, vm string, o dbusapi.AttachOptions) (dbusapi.Instance, error) {
	return fakeInstances()[1], f.record("CreateAndAttach %s %s %s", r.Tenant, r.Profile, vm)
}

func (f *fake) Detach(_ context.Context, id string) error { return f.record("Detach %s", id) }

func (f *fake) MigrationSource(_ context.Context, id string) (string, error) {
	return `{"version":1,"instance":"` + id + `"}`, f.record("MigrationSource %s", id)
}

func (f *fake) PrepareIncoming(_ context.Context, md, vm, tenant string) (dbusapi.Incoming, error) {
	return dbusapi.Incoming{Instance: "0d7c2f4e-3b1a-4c5d-8e9f-a0b1c2d3e4f5", Device: "0000:81:00.4", VMCompatibility: 15},
		f.record("PrepareIncoming %s vm=%q tenant=%q", md, vm, tenant)
}

func (f *fake) CommitIncoming(_ context.Context, id string) (dbusapi.Attachment, error) {
	return dbusapi.Attachment{VM: "web1", VMUUID: "8c0f6a3e-2d1b-4e5f-9a7c-6b5d4e3f2a10", Live: true}, f.record("CommitIncoming %s", id)
}

func (f *fake) AbortIncoming(_ context.Context, id string) error {
	return f.record("AbortIncoming %s", id)
}

func (f *fake) CompleteOutgoing(_ context.Context, id string) error {
	return f.record("CompleteOutgoing %s", id)
}

func (f *fake) CancelOutgoing(_ context.Context, id string) error {
	return f.record("CancelOutgoing %s", id)
}

func (f *fake) OutgoingDomainXML(_ context.Context, id, device string) (string, string, error) {
	return "<domain><name>web1</name></domain>", "", f.record("OutgoingDomainXML %s %s", id, device)
}

func (f *fake) DefineIncomingDomain(_ context.Context, id, xml string) error {
	return f.record("DefineIncomingDomain %s %s", id, xml)
}

func (f *fake) UndefineIncomingDomain(_ context.Context, id string) error {
	return f.record("UndefineIncomingDomain %s", id)
}

func (f *fake) UndefineOutgoingDomain(_ context.Context, id string) error {
	return f.record("UndefineOutgoingDomain %s", id)
}

func (f *fake) MigrationTarget(context.Context) (dbusapi.HostVersions, error) {
	return dbusapi.HostVersions{Host: "dst", Libvirt: "9.0.0", QEMU: "7.2.22", Kernel: "6.1.0"}, f.record("MigrationTarget ")
}

func (f *fake) PrecheckOutgoingLive(_ context.Context, id string, dst dbusapi.HostVersions) error {
	return f.record("PrecheckOutgoingLive %s %s qemu %s", id, dst.Host, dst.QEMU)
}

func (f *fake) MigrateOutgoingLive(_ context.Context, id, device, destURI, migrateURI string, dst dbusapi.HostVersions, keep bool) error {
	return f.record("MigrateOutgoingLive %s %s %s %q %s keep=%v", id, device, destURI, migrateURI, dst.Host, keep)
}

func (f *fake) HostdevXML(_ context.Context, id string) (string, error) {
	return "<hostdev mode=\"subsystem\" type=\"pci\" managed=\"no\">\n  <source>\n    <address domain=\"0x0000\" bus=\"0x81\" slot=\"0x00\" function=\"0x4\"></address>\n  </source>\n</hostdev>", f.record("HostdevXML %s", id)
}

func (f *fake) DefineTenant(_ context.Context, t dbusapi.TenantSpec) (dbusapi.Tenant, error) {
	f.mu.Lock()
	f.defined = t
	f.mu.Unlock()
	out := fakeTenants()[1]
	out.Name, out.Quota, out.Class = t.Name, t.Quota, t.Class
	return out, f.record("DefineTenant %s", t.Name)
}

func (f *fake) SetQuota(_ context.Context, name string, q dbusapi.Quota) (dbusapi.Tenant, error) {
	f.mu.Lock()
	f.quota = q
	f.mu.Unlock()
	out := fakeTenants()[1]
	out.Quota = q
	return out, f.record("SetQuota %s", name)
}

func (f *fake) UndefineTenant(_ context.Context, name string, force bool) error {
	return f.record("UndefineTenant %s %v", name, force)
}

func (f *fake) Apply(_ context.Context, name string, data []byte, sel string, dryRun bool) (dbusapi.ApplyResult, error) {
	if f.applyNothing {
		result := []byte(`{"done":[],"remaining":[]}`)
		if dryRun {
			result = []byte("null")
		}
		return dbusapi.ApplyResult{DryRun: dryRun, Changes: []byte(`{"changes":[]}`), Result: result, Summary: f.applySummary},
			f.record("Apply %s %d %s %v", name, len(data), sel, dryRun)
	}
	return dbusapi.ApplyResult{DryRun: dryRun, Changes: []byte(`{"changes":[{"op":"create","profile":"1g.10gb"}]}`), Result: []byte("null"),
		Summary: "create 1g.10gb for tenant acme on 0000:41:00.0\n"}, f.record("Apply %s %d %s %v", name, len(data), sel, dryRun)
}

func (f *fake) Reconcile(context.Context) (dbusapi.ReconcileReport, error) {
	return dbusapi.ReconcileReport{DurationSeconds: 0.012, Finished: []string{}, Undone: []string{}, Recreated: []string{"0b4f5c1e-9a3d-4e2b-8c7f-1a2b3c4d5e6f"},
		Lost: []string{}, Failed: []string{}, Foreign: []dbusapi.Foreign{{GPU: "0000:41:00.0", Kind: "gpu-instance", ID: "3", Detail: "1g.10gb at slot 0"}}, Attachments: []string{}, Pending: []string{"5d2c9e61-0f4b-4f8e-9a51-3b7c2d1e0f9a: attach to VM vm1 not settled: libvirt not connected"}}, f.record("Reconcile")
}

func (f *fake) Defragment(_ context.Context, r dbusapi.PlanRequest, apply bool) (dbusapi.DefragResult, error) {
	return dbusapi.DefragResult{Moves: []dbusapi.Move{{Instance: "0b4f5c1e-9a3d-4e2b-8c7f-1a2b3c4d5e6f", Profile: "3g.40gb", FromGPU: "0000:41:00.0", FromStart: 4, ToGPU: "0000:41:00.0", ToStart: 0}},
		GPU: "0000:41:00.0", Start: 4, Applied: apply}, f.record("Defragment %s %v", r.Profile, apply)
}

func (f *fake) SetMIGMode(_ context.Context, gpu string, on bool) error {
	return f.record("SetMIGMode %s %v", gpu, on)
}

func (f *fake) SetHeterogeneous(_ context.Context, gpu string, on bool) error {
	return f.record("SetHeterogeneous %s %v", gpu, on)
}

func (f *fake) SetGPUInstanceScheduler(_ context.Context, gpu string, gi int, mode, policy string, ts time.Duration) (dbusapi.GPUScheduler, error) {
	if err := f.record("SetGPUInstanceScheduler %s %d %q %q %v", gpu, gi, mode, policy, ts); err != nil {
		return dbusapi.GPUScheduler{}, err
	}
	if mode == "adaptive" {
		return dbusapi.GPUScheduler{Mode: "adaptive"}, nil
	}
	return dbusapi.GPUScheduler{Mode: "pinned"}, nil
}

func (f *fake) SetGPUScheduler(_ context.Context, gpu, mode, policy string, ts time.Duration) (dbusapi.GPUScheduler, error) {
	if err := f.record("SetGPUScheduler %s %q %q %v", gpu, mode, policy, ts); err != nil {
		return dbusapi.GPUScheduler{}, err
	}
	if mode == "adaptive" {
		return dbusapi.GPUScheduler{Mode: "adaptive"}, nil
	}
	if policy == "fixed_share" {
		return dbusapi.GPUScheduler{Mode: "pinned", Pending: true, Detail: "the driver refuses a change while a VM with a vGPU runs on the GPU; set when they stop"}, nil
	}
	return dbusapi.GPUScheduler{Mode: "pinned"}, nil
}

func (f *fake) ClearGPU(_ context.Context, gpu string) error {
	return f.record("ClearGPU %s", gpu)
}

func (f *fake) Shares(context.Context) ([]dbusapi.ShareRow, error) {
	return []dbusapi.ShareRow{
		{Instance: "0b4f5c1e-9a3d-4e2b-8c7f-1a2b3c4d5e6f", EntitledMilli: 375},
		{Instance: "7d2e9f10-4b5a-4c6d-9e8f-0a1b2c3d4e5f", EntitledMilli: 166, AchievedMilli: &f1, DemandMilli: &f1, Interference: &f2},
	}, f.record("Shares")
}

func (f *fake) FleetStatus(context.Context) (dbusapi.FleetStatus, error) {
	last := t0
	return dbusapi.FleetStatus{Endpoint: "http://placement:8778", Host: "gpu-7", Root: "3f1c8a52-7d0e-5b6a-9c4f-2e8d1b0a6c73", LastSync: &last,
		Providers: []dbusapi.FleetProvider{
			{UUID: "6a0e5d2c-1b3f-5e4a-8d7c-9f0b1a2c3d4e", Name: "gpu-7_pci_0000_41_00_0", GPU: "0000:41:00.0", InPlacement: true, HostAllocations: 1, PlacementAllocations: 2,
				Classes: []dbusapi.FleetClass{
					{Class: "CUSTOM_VGPUD_MIG_3G_40GB", HostTotal: 2, HostMaxUnit: 1, PlacementTotal: 2, PlacementUsed: 1},
					{Class: "CUSTOM_VGPUD_MIG_SLICE", HostTotal: 8, HostMaxUnit: 8, PlacementTotal: 8, PlacementUsed: 5}}},
			{UUID: "0d9c8b7a-6f5e-5d4c-8b3a-2f1e0d9c8b7a", Name: "gpu-7_pci_0000_81_00_0", GPU: "0000:81:00.0",
				Classes: []dbusapi.FleetClass{{Class: "CUSTOM_VGPUD_L4_4Q", HostTotal: 6, HostReserved: 6, HostMaxUnit: 1}}}},
		Differences: []dbusapi.FleetDifference{
			{Kind: "provider-missing", Provider: "gpu-7_pci_0000_81_00_0", Subject: "0d9c8b7a-6f5e-5d4c-8b3a-2f1e0d9c8b7a", Host: "GPU 0000:81:00.0", Placement: "none"},
			{Kind: "allocation-stale", Provider: "gpu-7_pci_0000_41_00_0", Subject: "5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a8b", Host: "no instance", Placement: "CUSTOM_VGPUD_MIG_1G_10GB=1,CUSTOM_VGPUD_MIG_SLICE=1"}}}, f.record("FleetStatus")
}

func (f *fake) Events(ctx context.Context) (<-chan dbusapi.Event, error) {
	if err := f.record("Events"); err != nil {
		return nil, err
	}
	ch := make(chan dbusapi.Event, 2)
	ch <- dbusapi.Event{Time: t0, Signal: "InterfacesAdded", Object: "/dev/vgpud1/instance/0b4f5c1e_9a3d_4e2b_8c7f_1a2b3c4d5e6f", Kind: "instance",
		ID: "0b4f5c1e-9a3d-4e2b-8c7f-1a2b3c4d5e6f", Changed: map[string]any{"State": "ready", "Tenant": "acme"}}
	ch <- dbusapi.Event{Time: t0, Signal: "OperationFinished", Object: "/dev/vgpud1", Kind: "instance", ID: "0b4f5c1e-9a3d-4e2b-8c7f-1a2b3c4d5e6f", Operation: "create"}
	go func() {
		<-ctx.Done()
		close(ch)
	}()
	return ch, nil
}

// runFake runs one command line against f and returns stdout, stderr and
// the exit code.
func runFake(f *fake, args ...string) (string, string, int) {
	var out, errb strings.Builder
	code := run(context.Background(), args, streams{in: strings.NewReader(""), out: &out, err: &errb},
		func(context.Context, string) (api, error) { return f, nil })
	return out.String(), errb.String(), code
}
