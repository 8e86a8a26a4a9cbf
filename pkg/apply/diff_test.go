package apply_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

func TestDiffFreshHost(t *testing.T) {
	e := newEnv(t)
	before := e.summary()
	cs, err := apply.Diff(context.Background(), e.m, mustParse(t, "vgpud.yaml", ""))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"define tenant acme: vram=120GiB compute=2 instances=8 class=guaranteed",
		"define tenant beta: vram=48GiB compute=unlimited instances=unlimited class=best-effort models=L4-24GB,A10-24GB",
		"create 3g.40gb for tenant acme on 0000:41:00.0 (H100-SXM5-80GB)",
		"create 2g.20gb for tenant acme on 0000:41:00.0 (H100-SXM5-80GB)",
		"create 1g.10gb for tenant acme on 0000:41:00.0 (H100-SXM5-80GB)",
		"create 1g.10gb for tenant acme on 0000:41:00.0 (H100-SXM5-80GB)",
		"create A10-8Q for tenant beta on 0000:a1:00.0 (A10-24GB)",
		"create L4-4Q for tenant beta on 0000:81:00.0 (L4-24GB)",
		"create L4-4Q for tenant beta on 0000:81:00.0 (L4-24GB)",
	}
	if got := lines(cs); !slices.Equal(got, want) {
		t.Fatalf("changes:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(cs.Kept) != 0 || len(cs.Warnings) != 0 {
		t.Fatalf("kept %v, warnings %v", cs.Kept, cs.Warnings)
	}
	if e.summary() != before {
		t.Fatal("diff changed the host")
	}
}

// A host that partly matches the layout: what fits is kept (same UUIDs,
// same slots), only the difference is done, the GPU the file does not
// mention is untouched.
func TestDiffKeepsWhatFits(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.tenant("acme")
	e.tenant("beta")
	if _, err := e.m.UpdateTenant(ctx, tenant.Tenant{Name: "beta", Quota: tenant.Quota{VRAMBytes: 48 << 30, ComputeMilli: tenant.Unlimited, MaxInstances: tenant.Unlimited},
		AllowedModels: []string{"L4-24GB", "A10-24GB"}}); err != nil {
		t.Fatal(err)
	}
	// Another spelling of the profile the file asks for.
	k3g := e.create("acme", "H100-SXM5-80GB/3g.40gb", sim.DefaultH100MIG)
	// One more than the file asks for, filling the GPU: the one destroyed
	// must leave an aligned pair of slices for the 2g.20gb.
	ones := []store.Instance{e.create("acme", "1g.10gb", sim.DefaultH100MIG), e.create("acme", "1g.10gb", sim.DefaultH100MIG), e.create("acme", "1g.10gb", sim.DefaultH100MIG)}
	kL4 := e.create("beta", "NVIDIA L4-4Q", sim.DefaultL4)
	kA10 := e.create("beta", "A10-8Q", sim.DefaultA10)
	xA10 := e.create("acme", "A10-8Q", sim.DefaultA10)
	untouched := e.create("acme", "H100XM-20C", sim.DefaultH100TS)

	d := mustParse(t, "vgpud.yaml", "")
	cs, err := apply.Diff(ctx, e.m, d)
	if err != nil {
		t.Fatal(err)
	}
	destroyed := map[string]bool{}
	var got []string
	for _, c := range cs.Changes {
		if c.Op == apply.OpDestroy {
			destroyed[c.Instance] = true
			c.Instance = "X"
		}
		got = append(got, c.String())
	}
	want := []string{
		"destroy 1g.10gb X of tenant acme on 0000:41:00.0: the layout asks for 2",
		"destroy A10-8Q X of tenant acme on 0000:a1:00.0: not in the layout",
		"update tenant acme: vram=120GiB compute=2 instances=8 class=guaranteed: was vram=unlimited compute=unlimited instances=unlimited class=best-effort",
		"create 2g.20gb for tenant acme on 0000:41:00.0 (H100-SXM5-80GB)",
		"create L4-4Q for tenant beta on 0000:81:00.0 (L4-24GB)",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("changes:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(destroyed) != 2 || !destroyed[xA10.UUID] || destroyed[k3g.UUID] {
		t.Fatalf("destroyed %v", destroyed)
	}
	kept := []string{k3g.UUID, kL4.UUID, kA10.UUID}
	for _, o := range ones {
		if !destroyed[o.UUID] {
			kept = append(kept, o.UUID)
		}
	}
	slices.Sort(kept)
	if !slices.Equal(cs.Kept, kept) {
		t.Fatalf("kept %v, want %v", cs.Kept, kept)
	}

	e.apply(d)
	for _, id := range append(kept, untouched.UUID) {
		was := findInstance(t, []store.Instance{k3g, ones[0], ones[1], ones[2], kL4, kA10, untouched}, id)
		now, err := e.m.Instance(id)
		if err != nil {
			t.Fatalf("kept instance %s gone: %v", id, err)
		}
		if now.GIStart != was.GIStart || now.GIID != was.GIID || now.VF != was.VF || now.MdevUUID != was.MdevUUID {
			t.Fatalf("kept instance moved: %+v, was %+v", now, was)
		}
	}
	if got := e.layout(); !slices.Equal(got, []string{
		"0000:41:00.0 acme 1g.10gb×2", "0000:41:00.0 acme 2g.20gb×1", "0000:41:00.0 acme 3g.40gb×1",
		"0000:61:00.0 acme H100XM-20C×1", "0000:81:00.0 beta L4-4Q×1", "0000:81:00.0 beta NVIDIA L4-4Q×1", "0000:a1:00.0 beta A10-8Q×1",
	}) {
		t.Fatalf("layout %v", got)
	}
}

func findInstance(t *testing.T, list []store.Instance, id string) store.Instance {
	t.Helper()
	for _, r := range list {
		if r.UUID == id {
			return r
		}
	}
	t.Fatalf("no instance %s", id)
	return store.Instance{}
}

// attachedView reports some instances as attached to a VM, as the manager
// does once `vgpuctl attach` ran; the simulated host runs no libvirt.
type attachedView struct {
	*manager.Manager
	attached map[string]bool
}

func (a attachedView) AllInstances() ([]manager.InstanceView, error) {
	list, err := a.Manager.AllInstances()
	for i := range list {
		if a.attached[list[i].UUID] {
			list[i].Attachment = &store.Attachment{Instance: list[i].UUID, Domain: "vm1"}
		}
	}
	return list, err
}

func TestDiffRefusals(t *testing.T) {
	e := newEnv(t)
	e.tenant("acme")
	e.tenant("idle")
	onTS := e.create("acme", "H100XM-20C", sim.DefaultH100TS)
	before := e.summary()
	const h = "version: v1\n"
	cases := []struct {
		name, file string
		m          apply.Manager
		kind       error
		field, msg string
	}{
		{"unknown GPU", h + "layout: [{gpu: '0000:ff:00.0'}]", nil, manager.ErrNotFound, "layout[0].gpu", `no GPU "0000:ff:00.0"`},
		{"unknown index", h + "layout: [{gpu: '9'}]", nil, manager.ErrNotFound, "layout[0].gpu", `no GPU "9"`},
		{"unknown profile", h + "layout: [{gpu: '0', instances: [{profile: 9g.90gb, tenant: acme}]}]", nil, manager.ErrInvalidArgument,
			"layout[0].instances[0].profile", `"9g.90gb" is not a MIG profile, vGPU type or "passthrough" of H100-SXM5-80GB`},
		{"profile of another model", h + "layout: [{gpu: '0', instances: [{profile: L4-24GB/L4-4Q, tenant: acme}]}]", nil, manager.ErrInvalidArgument,
			"layout[0].instances[0].profile", "is a profile of model L4-24GB, not of H100-SXM5-80GB"},
		{"MIG on and off on one GPU", h + "layout: [{gpu: '0', instances: [{profile: 3g.40gb, tenant: acme}, {profile: H100XM-20C, tenant: acme}]}]", nil,
			manager.ErrInvalidArgument, "layout[0].instances", "3g.40gb needs MIG on and H100XM-20C needs it off"},
		{"MIG off with a MIG profile", h + "layout: [{gpu: '0', mig: false, instances: [{profile: 1g.10gb, tenant: acme}]}]", nil,
			manager.ErrInvalidArgument, "layout[0].mig", "MIG off, but 1g.10gb needs it on"},
		{"MIG on with a time-sliced type", h + "layout: [{gpu: '1', mig: true, instances: [{profile: H100XM-20C, tenant: acme}]}]", nil,
			manager.ErrInvalidArgument, "layout[0].mig", "needs it off"},
		{"MIG on a GPU without MIG", h + "layout: [{gpu: '0000:81:00.0', mig: true}]", nil, manager.ErrInvalidArgument, "layout[0]", "has no MIG"},
		{"two spellings of one profile", h + "layout: [{gpu: '0', instances: [{profile: 3g.40gb, tenant: acme}, {profile: H100-SXM5-80GB/3g.40gb, tenant: acme}]}]", nil,
			manager.ErrInvalidArgument, "layout[0].instances[1]", "another spelling"},
		{"kind outside the scope", h + "layout: [{gpu: '0', scope: [vgpu], instances: [{profile: 1g.10gb, tenant: acme}]}]", nil,
			manager.ErrInvalidArgument, "layout[0].instances[0].profile", "outside this entry's scope (vgpu)"},
		{"same GPU by two names", h + "layout: [{gpu: '0'}, {gpu: '0000:41:00.0'}]", nil, manager.ErrInvalidArgument, "layout[1]", "which layout[0] selects too"},
		{"all fits no GPU", h + "layout: [{all: true, instances: [{profile: 9g.90gb, tenant: acme}]}]", nil, manager.ErrInvalidArgument, "layout[0]", "no GPU of this host can take 1×9g.90gb"},
		{"model offering part of the profiles", h + "layout: [{model: L4-24GB, instances: [{profile: L4-4Q, tenant: acme}, {profile: A10-4Q, tenant: acme}]}]", nil,
			manager.ErrInvalidArgument, "layout[0]", "offers L4-4Q but not A10-4Q"},
		{"unknown tenant", h + "layout: [{gpu: '0', instances: [{profile: 1g.10gb, tenant: nobody}]}]", nil, manager.ErrNotFound, "layout[0]", "tenant nobody is neither in the file nor defined on the host"},
		{"over the VRAM quota", h + "tenants: [{name: small, vram: 15GiB}]\nlayout: [{gpu: '0', instances: [{profile: 1g.10gb, tenant: small, count: 2}]}]", nil,
			manager.ErrQuotaExceeded, "layout[0]", "goes over its quota"},
		{"over the instance quota", h + "tenants: [{name: small, maxInstances: 1}]\nlayout: [{gpu: '0', instances: [{profile: 1g.10gb, tenant: small, count: 2}]}]", nil,
			manager.ErrQuotaExceeded, "layout[0]", "instance quota 1"},
		{"quota counts what the tenant keeps elsewhere", h + "tenants: [{name: acme, vram: 25GiB}]\nlayout: [{gpu: '0', instances: [{profile: 1g.10gb, tenant: acme}]}]", nil,
			manager.ErrQuotaExceeded, "layout[0]", "used 20GiB"},
		{"model not allowed", h + "tenants: [{name: l4only, allowedModels: [L4-24GB]}]\nlayout: [{gpu: '0', instances: [{profile: 1g.10gb, tenant: l4only}]}]", nil,
			manager.ErrInvalidArgument, "layout[0]", "may not use 1g.10gb"},
		{"prune leaves instances", h + "prune: true\ntenants: [{name: idle}]", nil, manager.ErrBusy, "prune", "tenant acme is not in the file, but owns instances"},
		{"pruned tenant asked for", h + "prune: true\ntenants: [{name: acme}]\nlayout: [{gpu: '0', instances: [{profile: 1g.10gb, tenant: idle}]}]", nil,
			manager.ErrNotFound, "layout[0]", "tenant idle is pruned"},
		{"attached instance in the way", h + "layout: [{gpu: '1'}]", attachedView{e.m, map[string]bool{onTS.UUID: true}}, manager.ErrBusy, "layout",
			"attached to VMs: " + onTS.UUID + " (H100XM-20C on 0000:61:00.0, VM vm1)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := apply.Parse("host.yaml", []byte(c.file), "")
			if err != nil {
				t.Fatal(err)
			}
			m := c.m
			if m == nil {
				m = e.m
			}
			cs, err := apply.Diff(context.Background(), m, d)
			if err == nil {
				t.Fatalf("diff succeeded:\n%s", cs)
			}
			if !errors.Is(err, c.kind) {
				t.Fatalf("error %v, want %v", err, c.kind)
			}
			var fe *apply.FileError
			if !errors.As(err, &fe) || fe.File != "host.yaml" || !strings.HasPrefix(fe.Field, c.field) {
				t.Fatalf("error %q: want a FileError for field %s", err, c.field)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("error %q lacks %q", err, c.msg)
			}
			if e.summary() != before {
				t.Fatal("diff changed the host")
			}
		})
	}
}

func TestDiffWarnings(t *testing.T) {
	e := newEnv(t)
	e.tenant("acme")
	ctx := context.Background()
	// A GPU instance vgpud did not create, on the GPU the file describes.
	lib := e.sim.NVML()
	lib.Init()
	dev, _ := lib.DeviceGetHandleByPciBusId(sim.DefaultH100MIG)
	info, _ := dev.GetGpuInstanceProfileInfo(0) // 1g.10gb
	if _, r := dev.CreateGpuInstance(&info); r != 0 {
		t.Fatalf("foreign GI: %v", r)
	}
	if err := e.sim.LoseGPU(sim.DefaultA10); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	d, err := apply.Parse("w.yaml", []byte(`version: v1
layout:
  - gpu: "0000:41:00.0"
    instances: [{profile: 1g.10gb, tenant: acme}]
  - model: A100-SXM4-40GB
  - gpu: "0000:a1:00.0"
  - gpu: "0000:81:00.0"
    deviceIDs: ["0x233010DE"]
`), "")
	if err != nil {
		t.Fatal(err)
	}
	cs, err := apply.Diff(ctx, e.m, d)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"layout[1]: no GPU of model A100-SXM4-40GB on this host; nothing to do for it",
		"layout[3]: GPU 0000:81:00.0 does not match the device filter 0x233010DE; left alone",
		"layout[0]: GPU 0000:41:00.0 holds 1 devices vgpud did not create; apply leaves them, and they keep their room",
		"layout[2]: GPU 0000:a1:00.0 is lost; it is left as it is until it returns",
	}
	if !slices.Equal(cs.Warnings, want) {
		t.Fatalf("warnings:\n%s\nwant\n%s", strings.Join(cs.Warnings, "\n"), strings.Join(want, "\n"))
	}
	if got := lines(cs); !slices.Equal(got, []string{"create 1g.10gb for tenant acme on 0000:41:00.0 (H100-SXM5-80GB)"}) {
		t.Fatalf("changes %v", got)
	}
}

func TestDiffTenants(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.tenant("same")
	e.tenant("ensured")
	e.tenant("changed")
	e.tenant("stray")
	if _, err := e.m.UpdateTenant(ctx, tenant.Tenant{Name: "ensured", Quota: tenant.Quota{VRAMBytes: 1 << 30, ComputeMilli: 100, MaxInstances: 1}}); err != nil {
		t.Fatal(err)
	}
	file := `version: v1
prune: %s
tenants:
  - {name: same}
  - {name: ensured, ensure: true}
  - {name: changed, vram: 10GiB, class: guaranteed, allowedProfiles: [L4-4Q]}
  - {name: fresh, compute: "0.5"}
`
	cases := []struct {
		prune string
		want  []string
	}{
		{"false", []string{
			"update tenant changed: vram=10GiB compute=unlimited instances=unlimited class=guaranteed profiles=L4-4Q: was vram=unlimited compute=unlimited instances=unlimited class=best-effort",
			"define tenant fresh: vram=unlimited compute=0.5 instances=unlimited class=best-effort",
		}},
		{"true", []string{
			"update tenant changed: vram=10GiB compute=unlimited instances=unlimited class=guaranteed profiles=L4-4Q: was vram=unlimited compute=unlimited instances=unlimited class=best-effort",
			"define tenant fresh: vram=unlimited compute=0.5 instances=unlimited class=best-effort",
			"undefine tenant stray: not in the file (prune)",
		}},
	}
	for _, c := range cases {
		t.Run("prune="+c.prune, func(t *testing.T) {
			d, err := apply.Parse("t.yaml", []byte(strings.Replace(file, "%s", c.prune, 1)), "")
			if err != nil {
				t.Fatal(err)
			}
			cs, err := apply.Diff(ctx, e.m, d)
			if err != nil {
				t.Fatal(err)
			}
			if got := lines(cs); !slices.Equal(got, c.want) {
				t.Fatalf("changes:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(c.want, "\n"))
			}
		})
	}
	d, err := apply.Parse("t.yaml", []byte(strings.Replace(file, "%s", "true", 1)), "")
	if err != nil {
		t.Fatal(err)
	}
	e.apply(d)
	ts, err := e.m.Tenants()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]tenant.Tenant{}
	for _, v := range ts {
		got[v.Name] = v.Tenant.Tenant
	}
	if _, ok := got["stray"]; ok || len(got) != 4 {
		t.Fatalf("tenants %v", got)
	}
	if got["ensured"].Quota.MaxInstances != 1 || got["changed"].Quota.VRAMBytes != 10<<30 || got["changed"].Class != tenant.Guaranteed ||
		!reflect.DeepEqual(got["changed"].AllowedProfiles, []string{"L4-4Q"}) || got["fresh"].Quota.ComputeMilli != 500 {
		t.Fatalf("tenants %+v", got)
	}
}

// A GPU entry wins over a model entry, which wins over all, whatever
// their order in the file.
func TestDiffPrecedence(t *testing.T) {
	e := newEnv(t)
	e.tenant("acme")
	keep := e.create("acme", "1g.10gb", sim.DefaultH100MIG)
	keepTS := e.create("acme", "H100XM-20C", sim.DefaultH100TS)
	onL4 := e.create("acme", "L4-4Q", sim.DefaultL4)
	onA10 := e.create("acme", "A10-4Q", sim.DefaultA10)
	d, err := apply.Parse("p.yaml", []byte(`version: v1
layout:
  - gpu: "0"
    instances: [{profile: 1g.10gb, tenant: acme}]
  - all: true
  - model: H100-SXM5-80GB
    instances: [{profile: H100XM-20C, tenant: acme, count: 2}]
`), "")
	if err != nil {
		t.Fatal(err)
	}
	cs, err := apply.Diff(context.Background(), e.m, d)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"destroy L4-4Q " + onL4.UUID + " of tenant acme on 0000:81:00.0: not in the layout",
		"destroy A10-4Q " + onA10.UUID + " of tenant acme on 0000:a1:00.0: not in the layout",
		"create H100XM-20C for tenant acme on 0000:61:00.0 (H100-SXM5-80GB)",
	}
	if got := lines(cs); !slices.Equal(got, want) {
		t.Fatalf("changes:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !slices.Equal(cs.Kept, func() []string { s := []string{keep.UUID, keepTS.UUID}; slices.Sort(s); return s }()) {
		t.Fatalf("kept %v", cs.Kept)
	}
	if !strings.Contains(cs.String(), "create H100XM-20C") {
		t.Fatalf("String() = %q", cs.String())
	}
	e.apply(d)
}
