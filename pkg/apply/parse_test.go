package apply_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

func TestParseSamples(t *testing.T) {
	yes, no := true, false
	n := func(i int) *int { return &i }
	migScope := []store.InstanceKind{store.KindMIG, store.KindMIGVGPU}
	vgpuScope := []store.InstanceKind{store.KindVGPU, store.KindMIGVGPU}
	cases := []struct {
		name, file, config string
		want               apply.Desired
	}{
		{"vgpud", "vgpud.yaml", "", apply.Desired{Version: "v1", Format: apply.FormatVgpud, Source: "vgpud.yaml",
			Tenants: []apply.TenantSpec{
				{Name: "acme", VRAM: "120GiB", Compute: "2", MaxInstances: "8", Class: "guaranteed"},
				{Name: "beta", VRAM: "48GiB", Compute: "unlimited", AllowedModels: []string{"L4-24GB", "A10-24GB"}},
			},
			Layout: []apply.LayoutEntry{
				{GPU: sim.DefaultH100MIG, MIG: &yes, Source: "layout[0]", Instances: []apply.InstanceSpec{
					{Profile: "3g.40gb", Tenant: "acme", Count: n(1)}, {Profile: "2g.20gb", Tenant: "acme", Count: n(1)}, {Profile: "1g.10gb", Tenant: "acme", Count: n(2)}}},
				{Model: "L4-24GB", Source: "layout[1]", Instances: []apply.InstanceSpec{{Profile: "L4-4Q", Tenant: "beta", Count: n(2)}}},
				{GPU: "3", Source: "layout[2]", Instances: []apply.InstanceSpec{{Profile: "A10-8Q", Tenant: "beta", Count: n(1)}}},
			}}},
		{"mig-parted mixed with a tenant", "mig-parted.yaml", "gpu0-balanced@acme", apply.Desired{Version: "v1", Format: apply.FormatMigParted,
			Source: "mig-parted.yaml", Config: "gpu0-balanced",
			Tenants: []apply.TenantSpec{{Name: "acme", Ensure: true}},
			Layout: []apply.LayoutEntry{
				{GPU: "0", MIG: &yes, Scope: migScope, Optional: true, Source: "mig-configs.gpu0-balanced[0]", Instances: []apply.InstanceSpec{
					{Profile: "1g.10gb", Tenant: "acme", Count: n(2)}, {Profile: "2g.20gb", Tenant: "acme", Count: n(1)}, {Profile: "3g.40gb", Tenant: "acme", Count: n(1)}}},
				{GPU: "1", MIG: &no, Scope: migScope, Optional: true, Source: "mig-configs.gpu0-balanced[1]"},
			}}},
		{"mig-parted all with a filter", "mig-parted.yaml", "all-1g.10gb", apply.Desired{Version: "v1", Format: apply.FormatMigParted,
			Source: "mig-parted.yaml", Config: "all-1g.10gb",
			Tenants: []apply.TenantSpec{{Name: apply.DefaultTenant, Ensure: true}},
			Layout: []apply.LayoutEntry{{All: true, DeviceIDs: []string{"0x233010DE"}, MIG: &yes, Scope: migScope, Optional: true, Source: "mig-configs.all-1g.10gb[0]",
				Instances: []apply.InstanceSpec{{Profile: "1g.10gb", Tenant: apply.DefaultTenant, Count: n(7)}}}}}},
		{"mig-parted disabled", "mig-parted.yaml", "all-disabled", apply.Desired{Version: "v1", Format: apply.FormatMigParted,
			Source: "mig-parted.yaml", Config: "all-disabled",
			Tenants: []apply.TenantSpec{{Name: apply.DefaultTenant, Ensure: true}},
			Layout:  []apply.LayoutEntry{{All: true, MIG: &no, Scope: migScope, Optional: true, Source: "mig-configs.all-disabled[0]"}}}},
		{"vgpu-device-manager", "vgpu-device-manager.yaml", "L4-4Q", apply.Desired{Version: "v1", Format: apply.FormatVGPUDeviceManager,
			Source: "vgpu-device-manager.yaml", Config: "L4-4Q",
			Tenants: []apply.TenantSpec{{Name: apply.DefaultTenant, Ensure: true}},
			Layout: []apply.LayoutEntry{{All: true, Scope: vgpuScope, Optional: true, Source: "vgpu-configs.L4-4Q[0]",
				Instances: []apply.InstanceSpec{{Profile: "L4-4Q", Tenant: apply.DefaultTenant, Count: n(6)}}}}}},
		{"vgpu-device-manager per GPU", "vgpu-device-manager.yaml", "mixed@ops", apply.Desired{Version: "v1", Format: apply.FormatVGPUDeviceManager,
			Source: "vgpu-device-manager.yaml", Config: "mixed",
			Tenants: []apply.TenantSpec{{Name: "ops", Ensure: true}},
			Layout: []apply.LayoutEntry{
				{GPU: "1", IndexOrder: apply.IndexPCI, Scope: vgpuScope, Optional: true, Source: "vgpu-configs.mixed[0]", Instances: []apply.InstanceSpec{{Profile: "H100XM-20C", Tenant: "ops", Count: n(4)}}},
				{GPU: "2", IndexOrder: apply.IndexPCI, Scope: vgpuScope, Optional: true, Source: "vgpu-configs.mixed[1]", Instances: []apply.InstanceSpec{{Profile: "L4-4Q", Tenant: "ops", Count: n(2)}}},
				{GPU: "3", IndexOrder: apply.IndexPCI, Scope: vgpuScope, Optional: true, Source: "vgpu-configs.mixed[2]", Instances: []apply.InstanceSpec{{Profile: "A10-8Q", Tenant: "ops", Count: n(3)}}},
			}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := mustParse(t, c.file, c.config)
			if !reflect.DeepEqual(*d, c.want) {
				t.Fatalf("got\n%s\nwant\n%s", js(d), js(c.want))
			}
			// JSON round trip.
			var back apply.Desired
			if err := json.Unmarshal([]byte(js(d)), &back); err != nil || !reflect.DeepEqual(back, *d) {
				t.Fatalf("JSON round trip: %v\n%s", err, js(back))
			}
			// Conversion to the vgpud format keeps the meaning.
			y, err := d.VgpudYAML()
			if err != nil {
				t.Fatal(err)
			}
			conv, err := apply.Parse("converted.yaml", y, "")
			if err != nil {
				t.Fatalf("parse converted:\n%s\n%v", y, err)
			}
			if len(conv.Layout) != len(d.Layout) || !reflect.DeepEqual(conv.Tenants, d.Tenants) {
				t.Fatalf("converted differs:\n%s", y)
			}
			for i := range conv.Layout {
				conv.Layout[i].Source = d.Layout[i].Source
			}
			if !reflect.DeepEqual(conv.Layout, d.Layout) {
				t.Fatalf("converted layout differs:\n%s", y)
			}
		})
	}
}

func js(v any) string {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		panic(err)
	}
	return string(b)
}

func TestParseForms(t *testing.T) {
	cases := []struct {
		name, data, config string
		check              func(t *testing.T, d *apply.Desired)
	}{
		{"quantities and counts", `
version: v1
tenants:
  - {name: a, maxInstances: unlimited}
  - {name: b, maxInstances: "3", vram: 1.5Ti, compute: 2500m}
  - {name: c}
`, "", func(t *testing.T, d *apply.Desired) {
			want := []tenant.Quota{tenant.UnlimitedQuota(), {VRAMBytes: 3 << 39, ComputeMilli: 2500, MaxInstances: 3}, tenant.UnlimitedQuota()}
			for i, s := range d.Tenants {
				tn, err := s.Tenant()
				if err != nil || tn.Quota != want[i] || tn.Class != tenant.BestEffort {
					t.Fatalf("tenant %d: %+v, %v", i, tn, err)
				}
			}
		}},
		{"count defaults to one, zero allowed", `
version: v1
layout:
  - gpu: "0"
    instances: [{profile: 1g.10gb, tenant: a}, {profile: 3g.40gb, tenant: a, count: 0}]
`, "", func(t *testing.T, d *apply.Desired) {
			if d.Layout[0].Instances[0].N() != 1 || d.Layout[0].Instances[1].N() != 0 {
				t.Fatalf("counts %+v", d.Layout[0].Instances)
			}
		}},
		{"mig-parted profile spellings", `
version: v1
mig-configs:
  c:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1c.1g.10gb": 1, "1g.10gb+me": 1, "1C.3g.40gb": 3, "3c.3g.40gb": 1}
`, "c", func(t *testing.T, d *apply.Desired) {
			var got []string
			for _, in := range d.Layout[0].Instances {
				got = append(got, in.Profile)
			}
			// Sorted by the file's spelling; 3c.3g.40gb is the GPU instance.
			if strings.Join(got, " ") != "1c.3g.40gb 1g.10gb 1g.10gb+me 3g.40gb" {
				t.Fatalf("profiles %v", got)
			}
		}},
		{"mig-parted filter as one string", `
version: v1
mig-configs:
  c: [{devices: all, device-filter: "0x233010DE", mig-enabled: false}]
`, "c", func(t *testing.T, d *apply.Desired) {
			if !reflect.DeepEqual(d.Layout[0].DeviceIDs, []string{"0x233010DE"}) {
				t.Fatalf("filter %v", d.Layout[0].DeviceIDs)
			}
		}},
		{"vgpu type with the driver prefix", `
version: v1
vgpu-configs:
  c: [{devices: [2], vgpu-devices: {"NVIDIA L4-4Q": 2}}]
`, "c", func(t *testing.T, d *apply.Desired) {
			if d.Layout[0].Instances[0].Profile != "L4-4Q" {
				t.Fatalf("profile %q", d.Layout[0].Instances[0].Profile)
			}
		}},
		{"JSON is YAML", `{"version": "v1", "layout": [{"all": true}]}`, "", func(t *testing.T, d *apply.Desired) {
			if !d.Layout[0].All {
				t.Fatal("all not set")
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := apply.Parse("f.yaml", []byte(c.data), c.config)
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, d)
		})
	}
}

func TestParseErrors(t *testing.T) {
	const mp = "version: v1\nmig-configs:\n  c:\n"
	const vd = "version: v1\nvgpu-configs:\n  c:\n"
	cases := []struct {
		name, data, config string
		// msg must appear in the error; field too when set.
		field, msg string
	}{
		{"not YAML", "version: [", "", "", "not YAML"},
		{"not a mapping", "- a\n- b", "", "", "want a mapping"},
		{"empty file", "", "", "", "want a mapping"},
		{"no version", "layout: []", "", "version", `want "v1", got ""`},
		{"other version", "version: v2", "", "version", `got "v2"`},
		{"unknown field", "version: v1\ntenant: []", "", "", `unknown field "tenant"`},
		{"unknown field in an entry", "version: v1\nlayout: [{gpu: '0', migmode: true}]", "", "", `unknown field "migmode"`},
		{"config for a vgpud file", "version: v1", "x", "", "no named configs"},
		{"bad tenant name", "version: v1\ntenants: [{name: Bad_Name}]", "", "tenants[0].name", "invalid tenant name"},
		{"tenant twice", "version: v1\ntenants: [{name: a}, {name: a}]", "", "tenants[1].name", "already defined at tenants[0]"},
		{"bad VRAM", "version: v1\ntenants: [{name: a, vram: 12XB}]", "", "tenants[0].vram", `unknown unit "XB"`},
		{"bad compute", "version: v1\ntenants: [{name: a, compute: '-1'}]", "", "tenants[0].compute", "negative"},
		{"negative max instances", "version: v1\ntenants: [{name: a, maxInstances: -1}]", "", "tenants[0].maxInstances", "whole number"},
		{"word max instances", "version: v1\ntenants: [{name: a, maxInstances: lots}]", "", "tenants[0].maxInstances", "whole number"},
		{"object max instances", "version: v1\ntenants: [{name: a, maxInstances: {a: 1}}]", "", "", "maxInstances"},
		{"bad class", "version: v1\ntenants: [{name: a, class: gold}]", "", "tenants[0].class", `class "gold"`},
		{"allowed profile twice", "version: v1\ntenants: [{name: a, allowedProfiles: [x, x]}]", "", "tenants[0]", "listed twice"},
		{"no selector", "version: v1\nlayout: [{instances: []}]", "", "layout[0]", "exactly one of gpu"},
		{"two selectors", "version: v1\nlayout: [{gpu: '0', all: true}]", "", "layout[0]", "got 2"},
		{"spaces around gpu", "version: v1\nlayout: [{gpu: ' 0'}]", "", "layout[0].gpu", "surrounding spaces"},
		{"same GPU twice", "version: v1\nlayout: [{gpu: '0'}, {gpu: '0'}]", "", "layout[1]", "same GPUs (gpu 0) as layout[0]"},
		{"all twice", "version: v1\nlayout: [{all: true}, {all: true}]", "", "layout[1]", "as layout[0]"},
		{"device id without 0x", "version: v1\nlayout: [{all: true, deviceIDs: ['233010DE']}]", "", "layout[0].deviceIDs[0]", "want 0x"},
		{"device id with subsystem", "version: v1\nlayout: [{all: true, deviceIDs: ['0x233010DE:0x16C110DE']}]", "", "layout[0].deviceIDs[0]", "subsystem"},
		{"bad scope", "version: v1\nlayout: [{all: true, scope: [vm]}]", "", "layout[0].scope[0]", `unknown instance kind "vm"`},
		{"empty scope", "version: v1\nlayout: [{all: true, scope: []}]", "", "layout[0].scope", "empty list"},
		{"empty device ids", "version: v1\nlayout: [{model: L4-24GB, deviceIDs: []}]", "", "layout[0].deviceIDs", "empty list"},
		{"prune without tenants", "version: v1\nprune: true\nlayout: [{gpu: '0'}]", "", "prune", "would undefine every tenant"},
		{"no profile", "version: v1\nlayout: [{all: true, instances: [{tenant: a}]}]", "", "layout[0].instances[0].profile", "no profile"},
		{"no tenant", "version: v1\nlayout: [{all: true, instances: [{profile: L4-4Q}]}]", "", "layout[0].instances[0].tenant", "empty"},
		{"negative count", "version: v1\nlayout: [{all: true, instances: [{profile: L4-4Q, tenant: a, count: -2}]}]", "", "layout[0].instances[0].count", "negative"},
		{"huge count", "version: v1\nlayout: [{all: true, instances: [{profile: L4-4Q, tenant: a, count: 100000}]}]", "", "layout[0].instances[0].count", "at most 64"},
		{"fractional count", "version: v1\nlayout: [{all: true, instances: [{profile: L4-4Q, tenant: a, count: 1.5}]}]", "", "", "count"},
		{"profile twice", "version: v1\nlayout: [{all: true, instances: [{profile: L4-4Q, tenant: a}, {profile: L4-4Q, tenant: a}]}]", "", "layout[0].instances[1]", "already asked for at instances[0]"},
		{"too large", "version: v1\n#" + strings.Repeat("x", 5<<20), "", "", "larger than"},

		{"both NVIDIA formats", "version: v1\nmig-configs: {}\nvgpu-configs: {}", "c", "", "both mig-configs and vgpu-configs"},
		{"mig-parted without a config", mp + "    - {devices: all, mig-enabled: false}\n  d:\n    - {devices: all, mig-enabled: false}", "", "", "select one of its mig-configs configs (c, d)"},
		{"mig-parted unknown config", mp + "    - {devices: all, mig-enabled: false}", "nope", "mig-configs", `no config "nope"; the file has: c`},
		{"mig-parted no version", "mig-configs:\n  c: [{devices: all, mig-enabled: false}]", "c", "version", `want "v1"`},
		{"mig-parted no configs", "version: v1\nmig-configs: {}", "c", "mig-configs", "at least one named config"},
		{"mig-parted empty config", mp + "    []", "c", "mig-configs.c", "at least one entry"},
		{"mig-parted unknown field", mp + "    - {devices: all, mig-enabled: false, gpus: 2}", "c", "", `unknown field "gpus"`},
		{"mig-parted no devices", mp + "    - {mig-enabled: false}", "c", "mig-configs.c[0]", "missing required field devices"},
		{"mig-parted devices word", mp + "    - {devices: some, mig-enabled: false}", "c", "mig-configs.c[0].devices", `got "some"`},
		{"mig-parted devices object", mp + "    - {devices: {a: 1}, mig-enabled: false}", "c", "mig-configs.c[0].devices", "want all or a list"},
		{"mig-parted devices empty", mp + "    - {devices: [], mig-enabled: false}", "c", "mig-configs.c[0].devices", "empty list"},
		{"mig-parted empty device filter", mp + "    - {devices: all, device-filter: '', mig-enabled: false}", "c", "mig-configs.c[0].device-filter", "empty"},
		{"mig-parted empty device filter list", mp + "    - {devices: all, device-filter: [], mig-enabled: false}", "c", "mig-configs.c[0].device-filter", "empty"},
		{"mig-parted negative index", mp + "    - {devices: [-1], mig-enabled: false}", "c", "mig-configs.c[0].devices[0]", "negative"},
		{"mig-parted index twice", mp + "    - {devices: [1, 1], mig-enabled: false}", "c", "mig-configs.c[0].devices[1]", "listed twice"},
		{"mig-parted no mig-enabled", mp + "    - {devices: all}", "c", "mig-configs.c[0]", "missing required field mig-enabled"},
		{"mig-parted enabled without devices", mp + "    - {devices: all, mig-enabled: true}", "c", "mig-configs.c[0]", "mig-devices is required"},
		{"mig-parted disabled with devices", mp + "    - {devices: all, mig-enabled: false, mig-devices: {1g.10gb: 1}}", "c", "mig-configs.c[0].mig-devices", "while mig-enabled is false"},
		{"mig-parted bad profile", mp + "    - {devices: all, mig-enabled: true, mig-devices: {1x.10gb: 1}}", "c", `mig-configs.c[0].mig-devices["1x.10gb"]`, "not a MIG profile"},
		{"mig-parted unknown attribute", mp + "    - {devices: all, mig-enabled: true, mig-devices: {1g.10gb+foo: 1}}", "c", `mig-devices["1g.10gb+foo"]`, `attribute "+foo" is not known`},
		{"mig-parted two attributes", mp + "    - {devices: all, mig-enabled: true, mig-devices: {\"1g.24gb+me,gfx\": 1}}", "c", `mig-devices["1g.24gb+me,gfx"]`, `attribute "+me,gfx" is not known`},
		{"mig-parted negated gfx", mp + "    - {devices: all, mig-enabled: true, mig-devices: {1g.24gb-gfx: 1}}", "c", `mig-devices["1g.24gb-gfx"]`, `attribute "-gfx" is not known`},
		{"vgpu-device-manager attribute on a time-sliced type", vd + "    - {devices: all, vgpu-devices: {L4-4QME: 1}}", "c", `vgpu-devices["L4-4QME"]`, "not a vGPU type name"},
		{"vgpu-device-manager unknown attribute", vd + "    - {devices: all, vgpu-devices: {A30-1-6CXX: 1}}", "c", `vgpu-devices["A30-1-6CXX"]`, "not a vGPU type name"},
		{"vgpud index order unknown", "version: v1\nlayout:\n  - {gpu: \"0\", indexOrder: bus}", "", "layout[0].indexOrder", `unknown index order "bus"`},
		{"vgpud PCI order of an address", "version: v1\nlayout:\n  - {gpu: \"0000:41:00.0\", indexOrder: pci}", "", "layout[0].indexOrder", "counts GPUs by number"},
		{"mig-parted compute instance wider than its GPU instance", mp + "    - {devices: all, mig-enabled: true, mig-devices: {3c.2g.20gb: 1}}", "c", `mig-devices["3c.2g.20gb"]`, "does not fit a GPU instance of 2"},
		{"mig-parted compute instance of no slices", mp + "    - {devices: all, mig-enabled: true, mig-devices: {0c.2g.20gb: 1}}", "c", `mig-devices["0c.2g.20gb"]`, "does not fit"},
		{"mig-parted compute instance twice", mp + "    - {devices: all, mig-enabled: true, mig-devices: {1c.3g.40gb: 1, 1C.3g.40gb: 2}}", "c", `mig-devices["1c.3g.40gb"]`, `same profile as "1C.3g.40gb"`},
		{"mig-parted negative count", mp + "    - {devices: all, mig-enabled: true, mig-devices: {1g.10gb: -1}}", "c", `mig-devices["1g.10gb"]`, "negative"},
		{"mig-parted same profile twice", mp + "    - {devices: all, mig-enabled: true, mig-devices: {1g.10gb: 1, 1c.1g.10gb: 1}}", "c", `mig-devices["1g.10gb"]`, `same profile as "1c.1g.10gb"`},
		{"mig-parted bad filter", mp + "    - {devices: all, device-filter: ['0x2330'], mig-enabled: false}", "c", "mig-configs.c[0].device-filter[0]", "bad PCI device id"},
		{"mig-parted filter object", mp + "    - {devices: all, device-filter: {a: 1}, mig-enabled: false}", "c", "mig-configs.c[0].device-filter", "want a PCI id"},
		{"mig-parted no tenant after @", mp + "    - {devices: all, mig-enabled: false}", "c@", "", "names no tenant"},
		{"mig-parted bad tenant", mp + "    - {devices: all, mig-enabled: false}", "c@Acme", "", "bad owning tenant"},
		{"mig-parted GPU selected twice", mp + "    - {devices: [0], mig-enabled: false}\n    - {devices: [0], mig-enabled: true, mig-devices: {}}", "c", "mig-configs.c[1]", "as mig-configs.c[0]"},

		{"vgpu-dm without a config", vd + "    - {devices: all, vgpu-devices: {}}", "", "", "select one of its vgpu-configs configs (c)"},
		{"vgpu-dm unknown config", vd + "    - {devices: all, vgpu-devices: {}}", "d", "vgpu-configs", `no config "d"`},
		{"vgpu-dm no vgpu-devices", vd + "    - {devices: all}", "c", "vgpu-configs.c[0]", "missing required field vgpu-devices"},
		{"vgpu-dm unknown field", vd + "    - {devices: all, vgpu-devices: {}, mig-enabled: true}", "c", "", `unknown field "mig-enabled"`},
		{"vgpu-dm bad type", vd + "    - {devices: all, vgpu-devices: {l4_4q: 1}}", "c", `vgpu-configs.c[0].vgpu-devices["l4_4q"]`, "not a vGPU type name"},
		{"vgpu-dm zero count", vd + "    - {devices: all, vgpu-devices: {L4-4Q: 0}}", "c", `vgpu-devices["L4-4Q"]`, "want at least 1"},
		{"vgpu-dm other version", "version: v2\nvgpu-configs:\n  c: [{devices: all, vgpu-devices: {}}]", "c", "version", `got "v2"`},
		{"vgpu-dm bad devices", vd + "    - {devices: none, vgpu-devices: {}}", "c", "vgpu-configs.c[0].devices", `got "none"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := apply.Parse("bad.yaml", []byte(c.data), c.config)
			if err == nil {
				t.Fatalf("parsed: %s", js(d))
			}
			if !errors.Is(err, manager.ErrInvalidArgument) {
				t.Fatalf("error %v does not wrap ErrInvalidArgument", err)
			}
			var fe *apply.FileError
			if !errors.As(err, &fe) || fe.File != "bad.yaml" {
				t.Fatalf("error %#v is no FileError naming the file", err)
			}
			if !strings.HasPrefix(err.Error(), "bad.yaml") || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("error %q lacks %q", err, c.msg)
			}
			if c.field != "" && !strings.Contains(fe.Field, c.field) {
				t.Fatalf("field %q, want %q (error %q)", fe.Field, c.field, err)
			}
			if c.config != "" && !strings.Contains(c.config, "@") && fe.Config != c.config && strings.Contains(c.data, "configs") {
				t.Fatalf("config %q not named in %q", c.config, err)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"vgpud.yaml", "mig-parted.yaml", "vgpu-device-manager.yaml"} {
		b, err := readFileF(name)
		if err != nil {
			f.Fatal(err)
		}
		for _, cfg := range []string{"", "all-1g.10gb", "gpu0-balanced@acme", "L4-4Q", "mixed"} {
			f.Add(b, cfg)
		}
	}
	f.Add([]byte("version: v1\nlayout: [{gpu: '0', instances: [{profile: x, tenant: a, count: 0}]}]"), "")
	f.Add([]byte("version: v1\ntenants: [{name: a, maxInstances: 3, vram: 1Gi}]"), "")
	f.Add([]byte("version: v1\nmig-configs: {c: [{devices: [0, 1], device-filter: '0x233010DE', mig-enabled: true, mig-devices: {1g.10gb: 1}}]}"), "c")
	f.Add([]byte("version: v1\nvgpu-configs: {c: [{devices: all, vgpu-devices: {A100-1-5CME: 1}}]}"), "c@x")
	f.Add([]byte("{"), "")
	// Scheduler values: in the range, at its bounds, out of it, and not
	// durations at all.
	for _, ts := range []string{"1ns", "999us", "1ms", "1.5ms", "2ms", "30ms", "30000001ns", "31ms", "2562047h", "2562048h", "-1ms", "0s", "0", "soon", "1e3ms", `""`} {
		f.Add([]byte("version: v1\nlayout: [{gpu: '0000:81:00.0', scheduler: {policy: fixed_share, timeslice: "+ts+"}}]"), "")
	}
	for _, sch := range []string{"{mode: adaptive}", "{mode: pinned, policy: best-effort}", "{policy: equalshare, timeslice: 5ms}", "{mode: adaptive, timeslice: 2ms}", "{policy: round_robin}", "{}"} {
		f.Add([]byte("version: v1\nlayout: [{model: L4-24GB, scheduler: "+sch+"}]"), "")
	}
	// Compute-instance names in every spelling, in vgpud's format and
	// mig-parted's.
	for _, ci := range []string{"1c.3g.40gb", "01c.3g.40gb", "0001c.3g.40gb", "3c.3g.40gb", "03c.3g.40gb", "MIG 1c.3g.40gb", "H100-1c.3g.40gb",
		"H100-SXM5-80GB/01c.3g.40gb", "H100-3c.3g.40gb", "1c.1g.10gb+me", "0c.3g.40gb", "4c.3g.40gb", "99999999999999999999c.3g.40gb", "1C.3G.40GB"} {
		f.Add([]byte("version: v1\nlayout: [{gpu: '0000:41:00.0', instances: [{profile: '"+ci+"', tenant: a, count: 7}]}]"), "")
		f.Add([]byte("version: v1\nmig-configs: {c: [{devices: all, mig-enabled: true, mig-devices: {'"+ci+"': 7, 1c.3g.40gb: 1}}]}"), "c")
	}
	f.Fuzz(func(t *testing.T, data []byte, cfg string) {
		d, err := apply.Parse("fuzz.yaml", data, cfg)
		if err != nil {
			if !errors.Is(err, manager.ErrInvalidArgument) {
				t.Fatalf("error without ErrInvalidArgument: %v", err)
			}
			return
		}
		// A scheduler that parses sends the driver only what it takes.
		for _, e := range d.Layout {
			if e.Scheduler == nil || e.Scheduler.Timeslice == "" {
				continue
			}
			ts, err := time.ParseDuration(e.Scheduler.Timeslice)
			if err != nil || gpu.ValidateTimeslice(ts) != nil || ts == 0 {
				t.Fatalf("%s: time slice %q accepted (%v)", e.Source, e.Scheduler.Timeslice, err)
			}
		}
		// What parses converts to the vgpud format and parses again.
		y, err := d.VgpudYAML()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := apply.Parse("converted.yaml", y, ""); err != nil {
			t.Fatalf("converted file does not parse: %v\n%s", err, y)
		}
	})
}
