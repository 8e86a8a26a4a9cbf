package apply_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// valuesEnv is the default simulated host holding instances a refused
// layout must not touch: two H100XM-10C on the time-sliced H100, and a
// 2c.3g.40gb compute instance on the MIG H100, all of tenant acme.
func valuesEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	e.tenant("acme")
	e.create("acme", "H100XM-10C", sim.DefaultH100TS)
	e.create("acme", "H100XM-10C", sim.DefaultH100TS)
	e.create("acme", "2c.3g.40gb", sim.DefaultH100MIG)
	return e
}

// refusedUpFront runs a document the way `vgpuctl apply` does (parse, the
// dry run's Diff, Execute) and checks that it is refused by Parse or by
// the dry run, with a named error, and never first at Execute: the dry
// run and the apply must agree. Execute is run anyway when Diff lets a
// change set through, so a document the checks miss shows what it did.
// The host and the store must be as they were.
func refusedUpFront(t *testing.T, e *env, name, doc, config string, want ...string) {
	t.Helper()
	before := hostState(e)
	defer func() {
		t.Helper()
		if after := hostState(e); after != before {
			t.Fatalf("%s: the host or the store changed:\nbefore:\n%s\nafter:\n%s", name, before, after)
		}
	}()
	d, err := apply.Parse("values.yaml", []byte(doc), config)
	if err == nil {
		var cs apply.ChangeSet
		cs, err = apply.Diff(context.Background(), e.m, d)
		if err == nil {
			res, xerr := apply.Execute(context.Background(), e.m, cs)
			t.Fatalf("%s: the dry run let it through:\n%s\nexecute: %v, done %d, failed %v", name, cs, xerr, len(res.Done), res.Failed)
		}
		var fe *apply.FileError
		var pe *apply.PreflightError
		if !errors.As(err, &fe) && !errors.As(err, &pe) {
			t.Fatalf("%s: dry run error %T %v is neither a FileError nor a PreflightError", name, err, err)
		}
	} else {
		var fe *apply.FileError
		if !errors.As(err, &fe) {
			t.Fatalf("%s: parse error %T %v is not a FileError", name, err, err)
		}
	}
	named := false
	for _, s := range []error{manager.ErrInvalidArgument, manager.ErrNotFound, manager.ErrNoCapacity, manager.ErrQuotaExceeded, manager.ErrBusy} {
		named = named || errors.Is(err, s)
	}
	if !named {
		t.Fatalf("%s: error %v carries no manager sentinel", name, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: error %q lacks %q", name, err, w)
		}
	}
}

// vgpudBase is a vgpud document that applies on valuesEnv's host; each
// key is a placeholder the cases replace with an out-of-range value.
const vgpudBase = `version: {{version}}
tenants:
  - name: {{name}}
    vram: {{vram}}
    compute: {{compute}}
    maxInstances: {{maxInstances}}
    class: {{class}}
    allowedModels: {{allowedModels}}
    allowedProfiles: {{allowedProfiles}}
layout:
  - gpu: {{gpu}}
    deviceIDs: {{deviceIDs}}
    mig: {{mig}}
    scope: {{scope}}
    scheduler: {policy: {{policy}}, timeslice: {{timeslice}}}
    indexOrder: {{indexOrder}}
    instances:
      - {profile: {{profile}}, tenant: {{tenant}}, count: {{count}}}
  - gpu: "0000:41:00.0"
    mig: {{mig2}}
    instances:
      - {profile: {{ciProfile}}, tenant: acme, count: {{ciCount}}}
`

var vgpudDefaults = map[string]string{
	"version": "v1", "name": "acme", "vram": "unlimited", "compute": "unlimited", "maxInstances": "unlimited",
	"class": "best-effort", "allowedModels": "[H100-SXM5-80GB]", "allowedProfiles": "[]",
	"gpu": `"0000:61:00.0"`, "deviceIDs": `["0x233010DE"]`, "mig": "false", "scope": "[vgpu]",
	"policy": "fixed_share", "timeslice": "2ms", "indexOrder": "nvml",
	"profile": "H100XM-20C", "tenant": "acme", "count": "2",
	"mig2": "true", "ciProfile": "1c.3g.40gb", "ciCount": "2",
}

func fill(base string, defaults map[string]string, key, value string) string {
	out := base
	for k, v := range defaults {
		if k == key {
			v = value
		}
		out = strings.ReplaceAll(out, "{{"+k+"}}", v)
	}
	return out
}

// Every key of every layout format, given a value out of its range, is
// refused before the first change (by Parse or the dry run, so that the
// dry run and the apply agree), with a named error, and the host and the
// store stay as they were. The base documents themselves apply.
func TestApplyOutOfRangeValuesRefusedUpFront(t *testing.T) {
	// The base documents apply, each on a host of its own.
	for _, b := range []struct{ doc, config string }{
		{fill(vgpudBase, vgpudDefaults, "", ""), ""},
		{fill(migPartedBase, migPartedDefaults, "", ""), "c@acme"},
		{fill(vgpuDMBase, vgpuDMDefaults, "", ""), "c@acme"},
	} {
		e := valuesEnv(t)
		d, err := apply.Parse("base.yaml", []byte(b.doc), b.config)
		if err != nil {
			t.Fatalf("base document: %v\n%s", err, b.doc)
		}
		e.apply(d)
	}
	e := valuesEnv(t)
	for _, c := range []struct {
		key    string
		values []string
	}{
		{"version", []string{"v2", `""`, "v0"}},
		{"name", []string{"Acme", `""`, strings.Repeat("a", 64), "a_b"}},
		{"vram", []string{"-1GiB", "1ZiB", "1GiB", "0", "lots"}},
		{"compute", []string{"-1", "1m", "0", "1e400", "2.0001m"}},
		{"maxInstances", []string{"-1", "1", "1e99", "18446744073709551616", "2.5"}},
		{"class", []string{"gold", `""x`}},
		{"allowedModels", []string{"[L4-24GB]", "[h100]"}},
		{"allowedProfiles", []string{"[3g.40gb]", "[H100XM-10C]"}},
		{"gpu", []string{`"0000:ff:00.0"`, `"99"`, `"-1"`, `"0000:61:00.0 "`, `"GPU-00000000-0000-0000-0000-000000000000"`}},
		// A well-formed filter the GPU does not pass is no error: the
		// entry leaves the GPU alone, with a warning (docs/apply.md).
		{"deviceIDs", []string{`[]`, `["0x2330"]`, `["0x233010DE:0x16C110DE"]`, `["0xFFFFFFFFF"]`, `[7]`}},
		{"mig", []string{"true"}},
		{"scope", []string{"[mig]", "[]", "[gpu]"}},
		{"policy", []string{"round_robin", `""`}},
		{"timeslice", []string{"1ns", "999us", "999999ns", "30000001ns", "31ms", "2562047h", "-1ms", "0s", "soon"}},
		{"indexOrder", []string{"random"}},
		{"profile", []string{"H100XM-99C", "L4-4Q", "3g.40gb", `" H100XM-20C"`, "passthrough"}},
		{"tenant", []string{"nobody", "Bad_Name"}},
		{"count", []string{"-1", "5", "65", "1e9"}},
		{"mig2", []string{"false"}},
		{"ciProfile", []string{"4c.3g.40gb", "0c.3g.40gb", "8c.7g.80gb", "1c.3g.41gb", "3c.2g.20gb", "H100XM-20C"}},
		{"ciCount", []string{"7", "13", "-1", "65"}},
	} {
		for _, v := range c.values {
			t.Run("vgpud "+c.key+"="+v, func(t *testing.T) {
				refusedUpFront(t, e, "vgpud "+c.key+"="+v, fill(vgpudBase, vgpudDefaults, c.key, v), "")
			})
		}
	}
	for _, c := range []struct {
		key    string
		values []string
	}{
		{"version", []string{"v2"}},
		{"devices", []string{"[99]", "[-1]", "[]", "some"}},
		{"filter", []string{`"0x00000000"`, `"0xZZ"`, `[]`}},
		{"enabled", []string{"false"}},
		{"profile", []string{"4c.3g.40gb", "0c.3g.40gb", "3c.2g.20gb", "1g.10gb+xx", "9g.90gb"}},
		{"count", []string{"7", "-1", "1e3"}},
		{"count2", []string{"8", "5"}}, // 1g.10gb: 7 at most, and 4 beside the 3g.40gb of 1c.3g.40gb×2
	} {
		for _, v := range c.values {
			t.Run("mig-parted "+c.key+"="+v, func(t *testing.T) {
				refusedUpFront(t, e, "mig-parted "+c.key+"="+v, fill(migPartedBase, migPartedDefaults, c.key, v), "c@acme")
			})
		}
	}
	for _, c := range []struct {
		key    string
		values []string
	}{
		{"version", []string{"v2"}},
		{"devices", []string{"[9]", "[-1]", "[]"}},
		{"filter", []string{`"0x00000000"`, `"0x1"`}},
		{"type", []string{"H100XM-99C", "L4-4Q", "H100XM-20", "NVIDIA"}},
		{"count", []string{"5", "0", "-1"}},
	} {
		for _, v := range c.values {
			t.Run("vgpu-device-manager "+c.key+"="+v, func(t *testing.T) {
				refusedUpFront(t, e, "vgpu-device-manager "+c.key+"="+v, fill(vgpuDMBase, vgpuDMDefaults, c.key, v), "c@acme")
			})
		}
	}
}

// A mig-parted config for the MIG H100 (NVML index 0) and a
// vgpu-device-manager config for the time-sliced one (PCI order 1).
const (
	migPartedBase = `version: {{version}}
mig-configs:
  c:
    - devices: {{devices}}
      device-filter: {{filter}}
      mig-enabled: {{enabled}}
      mig-devices: {"{{profile}}": {{count}}, "{{profile2}}": {{count2}}}
`
	vgpuDMBase = `version: {{version}}
vgpu-configs:
  c:
    - devices: {{devices}}
      device-filter: {{filter}}
      vgpu-devices: {"{{type}}": {{count}}}
`
)

var (
	migPartedDefaults = map[string]string{"version": "v1", "devices": "[0]", "filter": `"0x233010DE"`, "enabled": "true",
		"profile": "1c.3g.40gb", "count": "2", "profile2": "1c.1g.10gb", "count2": "1"}
	vgpuDMDefaults = map[string]string{"version": "v1", "devices": "[1]", "filter": `"0x233010DE"`, "type": "H100XM-20C", "count": "2"}
)

// A change set edited after its dry run is checked again by Execute
// before its first change: each value a change sends to the driver.
func TestExecuteRefusesEditedValues(t *testing.T) {
	e := valuesEnv(t)
	d := parseText(t, fill(vgpudBase, vgpudDefaults, "", ""))
	cs, err := apply.Diff(context.Background(), e.m, d)
	if err != nil {
		t.Fatal(err)
	}
	edit := func(f func(c *apply.Change) bool) apply.ChangeSet {
		t.Helper()
		b, _ := json.Marshal(cs)
		var out apply.ChangeSet
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		hit := false
		for i := range out.Changes {
			hit = f(&out.Changes[i]) || hit
		}
		if !hit {
			t.Fatalf("no change edited in\n%s", cs)
		}
		return out
	}
	for _, ts := range []string{"1ns", "2562047h", "31ms", "-2ms"} {
		bad := edit(func(c *apply.Change) bool {
			if c.Op != apply.OpSetScheduler {
				return false
			}
			c.Scheduler = &apply.SchedulerSpec{Policy: "fixed_share", Timeslice: ts}
			return true
		})
		executeRefused(t, e, bad, apply.Limits{}, manager.ErrInvalidArgument, "scheduler", ts)
	}
	bad := edit(func(c *apply.Change) bool {
		if c.Op != apply.OpSetScheduler {
			return false
		}
		c.Scheduler = &apply.SchedulerSpec{Policy: "round_robin"}
		return true
	})
	executeRefused(t, e, bad, apply.Limits{}, manager.ErrInvalidArgument, "round_robin")
	// Seven single-slice compute instances of one tenant need three
	// 3g.40gb GPU instances; the H100 holds two.
	more := edit(func(c *apply.Change) bool {
		return c.Op == apply.OpCreate && c.Profile == "1c.3g.40gb"
	})
	one := apply.Change{}
	for _, c := range more.Changes {
		if c.Op == apply.OpCreate && c.Profile == "1c.3g.40gb" {
			one = c
		}
	}
	for len(more.Changes) < len(cs.Changes)+5 {
		more.Changes = append(more.Changes, one)
	}
	executeRefused(t, e, more, apply.Limits{}, manager.ErrNoCapacity, "1c.3g.40gb")
}

// A compute-instance profile has one name wherever it is compared: an
// instance created as "3c.3g.40gb" (the whole GPU instance) or
// "01c.3g.40gb" is kept by a layout asking for it in any spelling, in
// vgpud's format and mig-parted's, and never destroyed and re-created.
func TestApplyComputeInstanceSpellings(t *testing.T) {
	e := newEnv(t)
	e.tenant("acme")
	whole := e.create("acme", "3c.3g.40gb", sim.DefaultH100MIG)
	one := e.create("acme", "01c.3g.40gb", sim.DefaultH100MIG)
	ctx := context.Background()
	check := func(name string, d *apply.Desired) {
		t.Helper()
		cs, err := apply.Diff(ctx, e.m, d)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !cs.Empty() {
			t.Fatalf("%s: the instances already match, but:\n%s", name, cs)
		}
	}
	for _, p := range [][2]string{
		{"3g.40gb", "1c.3g.40gb"},
		{"3c.3g.40gb", "01c.3g.40gb"},
		{"H100-SXM5-80GB/3c.3g.40gb", "H100-SXM5-80GB/0001c.3g.40gb"},
		{"H100-3c.3g.40gb", "H100-1c.3g.40gb"},
		{"MIG 3c.3g.40gb", "MIG 1c.3g.40gb"},
	} {
		doc := "version: v1\nlayout:\n  - gpu: \"0000:41:00.0\"\n    instances:\n" +
			"      - {profile: \"" + p[0] + "\", tenant: acme}\n      - {profile: \"" + p[1] + "\", tenant: acme}\n"
		check("vgpud "+p[0]+", "+p[1], parseText(t, doc))
	}
	for _, p := range [][2]string{{"3g.40gb", "1c.3g.40gb"}, {"03c.3g.40gb", "01c.3g.40gb"}, {"3c.3g.40gb", "001c.3g.40gb"}} {
		doc := "version: v1\nmig-configs:\n  c:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"" + p[0] + "\": 1, \"" + p[1] + "\": 1}\n"
		d, err := apply.Parse("mig.yaml", []byte(doc), "c@acme")
		if err != nil {
			t.Fatal(err)
		}
		check("mig-parted "+p[0]+", "+p[1], d)
	}
	// Two spellings of one profile in one entry are one profile asked twice.
	_, err := apply.Parse("mig.yaml", []byte("version: v1\nmig-configs:\n  c:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"01c.3g.40gb\": 1, \"1c.3g.40gb\": 1}\n"), "c@acme")
	if !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("two spellings of 1c.3g.40gb: %v", err)
	}
	if ids := e.uuids(); !ids[whole.UUID] || !ids[one.UUID] {
		t.Fatal("instances lost")
	}
}

// Records an older vgpud stored as typed ("001c.3g.40gb", "3c.3g.40gb")
// compare by their canonical name before reconcile rewrites them.
func TestApplyOldRecordSpellings(t *testing.T) {
	e := newEnv(t)
	e.tenant("acme")
	whole := e.create("acme", "3g.40gb", sim.DefaultH100MIG)
	one := e.create("acme", "1c.3g.40gb", sim.DefaultH100MIG)
	old := map[string]string{whole.UUID: "3c.3g.40gb", one.UUID: "001c.3g.40gb"}
	if err := e.db.Update(func(tx *store.Tx) error {
		for id, p := range old {
			r, err := tx.Instance(id)
			if err != nil {
				return err
			}
			r.Profile = p
			if err := tx.PutInstance(&r); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	d := parseText(t, "version: v1\nlayout:\n  - gpu: \"0000:41:00.0\"\n    instances:\n      - {profile: 3g.40gb, tenant: acme}\n      - {profile: 1c.3g.40gb, tenant: acme}\n")
	cs, err := apply.Diff(context.Background(), e.m, d)
	if err != nil || !cs.Empty() {
		t.Fatalf("diff over old spellings: %v\n%s", err, cs)
	}
}

// A bad scheduler key says what is wrong once.
func TestApplySchedulerErrorSaidOnce(t *testing.T) {
	for _, s := range []string{"{policy: fixed_share, timeslice: soon}", "{policy: round_robin}", "{mode: sometimes}", "{policy: fixed_share, timeslice: 2562047h}"} {
		_, err := apply.Parse("host.yaml", []byte("version: v1\nlayout: [{gpu: '0000:81:00.0', scheduler: "+s+"}]"), "")
		if err == nil {
			t.Fatalf("%s: accepted", s)
		}
		msg := err.Error()
		i := strings.Index(msg, "scheduler: ")
		what := msg[i+len("scheduler: "):]
		if len(what) < 8 || strings.Count(msg, what[:len(what)/2]) != 1 || strings.Count(msg, "invalid argument") > 0 {
			t.Errorf("%s: %q repeats itself", s, msg)
		}
	}
}

// Turning MIG off on a GPU with a GPU instance vgpud did not create is
// refused by the dry run, naming it, before any change: the driver keeps
// MIG on while it exists, and there is no VM to stop.
func TestApplyMIGOffRefusedForForeignGPUInstance(t *testing.T) {
	e := newEnv(t)
	e.tenant("acme")
	e.create("acme", "3g.40gb", sim.DefaultH100MIG)
	lib := e.sim.NVML()
	lib.Init()
	dev, _ := lib.DeviceGetHandleByPciBusId(sim.DefaultH100MIG)
	info, _ := dev.GetGpuInstanceProfileInfo(0) // 1g.10gb
	if _, r := dev.CreateGpuInstance(&info); r != 0 {
		t.Fatalf("foreign GI: %v", r)
	}
	if err := e.m.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	doc := "version: v1\nlayout: [{gpu: '0000:41:00.0', mig: false}]\n"
	refusedUpFront(t, e, "MIG off", doc, "", "did not create", "GI ", "1g.10gb")
	d := parseText(t, doc)
	if _, err := apply.Diff(context.Background(), e.m, d); !errors.Is(err, manager.ErrBusy) || strings.Contains(err.Error(), "VM") {
		t.Fatalf("dry run: %v", err)
	}
}

// The scheduler's range is accepted inclusive: the dry run plans a
// set-scheduler change for 1ms and for 30ms.
func TestApplyTimesliceBoundsAccepted(t *testing.T) {
	e := newEnv(t)
	for _, ts := range []string{"1ms", "1000us", "30ms", "30000000ns"} {
		d := parseText(t, "version: v1\nlayout: [{gpu: '0000:81:00.0', scheduler: {policy: fixed_share, timeslice: "+ts+"}}]\n")
		cs, err := apply.Diff(context.Background(), e.m, d)
		if err != nil || len(cs.Changes) != 1 || cs.Changes[0].Op != apply.OpSetScheduler {
			t.Fatalf("timeslice %s: %v\n%s", ts, err, cs)
		}
	}
}

// Each value a change carries is checked before the first change, so an
// edited change set never stops at a step after its destroys.
func TestExecuteRefusesEditedChanges(t *testing.T) {
	e := valuesEnv(t)
	d := parseText(t, fill(vgpudBase, vgpudDefaults, "", ""))
	cs, err := apply.Diff(context.Background(), e.m, d)
	if err != nil {
		t.Fatal(err)
	}
	on, off := true, false
	for _, c := range []struct {
		name string
		add  apply.Change
		kind error
		want string
	}{
		{"unknown profile", apply.Change{Op: apply.OpCreate, GPU: sim.DefaultH100MIG, Profile: "4c.3g.40gb", Tenant: "acme"}, manager.ErrInvalidArgument, "4c.3g.40gb"},
		{"profile of another model", apply.Change{Op: apply.OpCreate, GPU: sim.DefaultH100TS, Profile: "L4-4Q", Tenant: "acme"}, manager.ErrInvalidArgument, "L4-4Q"},
		{"no mode", apply.Change{Op: apply.OpSetMIGMode, GPU: sim.DefaultL4}, manager.ErrInvalidArgument, "no mode"},
		{"MIG on a GPU without", apply.Change{Op: apply.OpSetMIGMode, GPU: sim.DefaultL4, MIG: &on}, manager.ErrInvalidArgument, "has no MIG"},
		{"no scheduler", apply.Change{Op: apply.OpSetScheduler, GPU: sim.DefaultL4}, manager.ErrInvalidArgument, "no scheduler"},
		{"scheduler under MIG", apply.Change{Op: apply.OpSetScheduler, GPU: sim.DefaultH100MIG, Scheduler: &apply.SchedulerSpec{Policy: "fixed_share"}}, manager.ErrInvalidArgument, "no time-sliced"},
		{"no settings", apply.Change{Op: apply.OpDefineTenant, Tenant: "beta"}, manager.ErrInvalidArgument, "no settings"},
		{"bad tenant name", apply.Change{Op: apply.OpDefineTenant, Tenant: "Beta_", Settings: &apply.TenantSettings{}}, manager.ErrInvalidArgument, "Beta_"},
		{"undefine nobody", apply.Change{Op: apply.OpUndefineTenant, Tenant: "nobody"}, manager.ErrNotFound, "nobody"},
		{"unknown op", apply.Change{Op: "reboot", GPU: sim.DefaultL4}, manager.ErrInvalidArgument, "reboot"},
		{"MIG off under MIG creates", apply.Change{Op: apply.OpSetMIGMode, GPU: sim.DefaultH100MIG, MIG: &off}, manager.ErrInvalidArgument, "need it on"},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := cs
			bad.Changes = append(slices.Clone(cs.Changes), c.add)
			executeRefused(t, e, bad, apply.Limits{}, c.kind, c.want)
		})
	}
}
