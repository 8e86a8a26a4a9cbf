package dbusapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/godbus/dbus/v5"
	"github.com/google/uuid"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
)

// hostileCall is the valid call a hostile one is made from: where it goes
// and its arguments. Every method the API defines has one (TestDBusHostileInput
// fails on a method without), so no method escapes the hostile-input test.
type hostileCall struct {
	path dbus.ObjectPath
	args []any
	// emptyOK lists the arguments (by index) whose empty value is valid and
	// documented: a read's "all" or "no filter", a class's default;
	// never a mutation's target.
	emptyOK map[int]bool
	// options are the method's own options with a valid value each.
	options map[string]any
	// bad are the method's own bad values, by argument index and name:
	// values of the right type that only its meaning refuses.
	bad map[int]map[string]any
}

// hostileCalls returns the valid starting call of every method, by
// "Interface.Method", on a host with tenant acme holding instance inst.
func hostileCalls(inst, layout string, rtxGI int32) map[string]hostileCall {
	mgr := ManagerPath
	opts := map[string]dbus.Variant{}
	create := map[string]any{"gpu": sim.DefaultL4, "uuid": "6f1c2b9e-51d2-4a37-9a0e-0c3c0d6f7a11", "affinity": "spread"}
	attach := map[string]any{"display": true, "ramfb": true, "tenant": "acme"}
	both := map[string]any{"gpu": sim.DefaultL4, "uuid": "6f1c2b9e-51d2-4a37-9a0e-0c3c0d6f7a11", "affinity": "spread", "display": true, "ramfb": true}
	q := uint64(1 << 30)
	return map[string]hostileCall{
		ManagerInterface + ".ListGPUs":        {path: mgr},
		ManagerInterface + ".ListInstances":   {path: mgr, args: []any{"acme"}, emptyOK: map[int]bool{0: true}},
		ManagerInterface + ".ListTenants":     {path: mgr},
		ManagerInterface + ".GetAccess":       {path: mgr},
		ManagerInterface + ".ListDomains":     {path: mgr, args: []any{opts}},
		ManagerInterface + ".ListProfiles":    {path: mgr, args: []any{sim.DefaultL4}, emptyOK: map[int]bool{0: true}},
		ManagerInterface + ".GetCapacity":     {path: mgr},
		ManagerInterface + ".Plan":            {path: mgr, args: []any{"acme", "L4-4Q", opts}, emptyOK: map[int]bool{0: true}, options: map[string]any{"gpu": sim.DefaultL4}},
		ManagerInterface + ".CreateInstance":  {path: mgr, args: []any{"acme", "L4-4Q", opts}, options: create, bad: map[int]map[string]any{1: badComputeNames}},
		ManagerInterface + ".DestroyInstance": {path: mgr, args: []any{inst, opts}, options: map[string]any{"detach": true}},
		ManagerInterface + ".Attach":          {path: mgr, args: []any{inst, "vm1", opts}, options: attach},
		ManagerInterface + ".CreateAndAttach": {path: mgr, args: []any{"acme", "L4-4Q", "vm1", opts}, options: both},
		ManagerInterface + ".Detach":          {path: mgr, args: []any{inst, opts}},
		ManagerInterface + ".GetHostdevXML":   {path: mgr, args: []any{inst}},
		// The instance is attached to no VM: MigrationSource refuses it,
		// and the metadata's driver blob is none the driver reads, so no
		// PrepareIncoming carves.
		ManagerInterface + ".MigrationSource":  {path: mgr, args: []any{inst, opts}},
		ManagerInterface + ".PrepareIncoming":  {path: mgr, args: []any{hostileMetadata, "vm1", "acme", opts}, emptyOK: map[int]bool{1: true, 2: true}},
		ManagerInterface + ".CommitIncoming":   {path: mgr, args: []any{inst, opts}},
		ManagerInterface + ".AbortIncoming":    {path: mgr, args: []any{inst, opts}},
		ManagerInterface + ".CompleteOutgoing": {path: mgr, args: []any{inst, opts}},
		ManagerInterface + ".CancelOutgoing":   {path: mgr, args: []any{inst, opts}},
		// No migration of the instance is under way: each refuses it.
		ManagerInterface + ".OutgoingDomainXML":      {path: mgr, args: []any{inst, "0000:81:00.4", opts}},
		ManagerInterface + ".DefineIncomingDomain":   {path: mgr, args: []any{inst, "<domain type='kvm'><name>vm1</name></domain>", opts}},
		ManagerInterface + ".UndefineOutgoingDomain": {path: mgr, args: []any{inst, opts}},
		ManagerInterface + ".UndefineIncomingDomain": {path: mgr, args: []any{inst, opts}},
		ManagerInterface + ".MigrationTarget":        {path: mgr, args: []any{opts}},
		ManagerInterface + ".PrecheckOutgoingLive":   {path: mgr, args: []any{inst, "dst", "9.0.0", "7.2.22", "6.1.0", opts}},
		ManagerInterface + ".MigrateOutgoingLive":    {path: mgr, args: []any{inst, "0000:81:00.4", "qemu+tls://dst/system", "", "dst", "9.0.0", "7.2.22", "6.1.0", false, opts}, emptyOK: map[int]bool{3: true}},
		ManagerInterface + ".DefineTenant": {path: mgr, args: []any{"beta", q, q, uint64(4), "guaranteed", opts}, emptyOK: map[int]bool{4: true}, options: map[string]any{"allowed-models": []string{"L4-24GB"}, "allowed-profiles": []string{"L4-4Q"}, "unlimited": []string{QuotaVRAM}},
			bad: map[int]map[string]any{5: {"unlimited quota unknown": map[string]dbus.Variant{"unlimited": dbus.MakeVariant([]string{"gpus"})}}}},
		ManagerInterface + ".SetQuota": {path: mgr, args: []any{"acme", q, q, uint64(4), opts}, options: map[string]any{"unlimited": []string{QuotaCompute}},
			bad: map[int]map[string]any{4: {"unlimited quota unknown": map[string]dbus.Variant{"unlimited": dbus.MakeVariant([]string{"gpus"})}}}},
		ManagerInterface + ".UndefineTenant":   {path: mgr, args: []any{"acme", true, opts}},
		ManagerInterface + ".Apply":            {path: mgr, args: []any{layout, "", false, opts}, emptyOK: map[int]bool{1: true}, options: map[string]any{"name": "layout.yaml"}, bad: map[int]map[string]any{0: badLayouts}},
		ManagerInterface + ".Reconcile":        {path: mgr, args: []any{opts}},
		ManagerInterface + ".Defragment":       {path: mgr, args: []any{"acme", "3g.40gb", true, opts}, options: map[string]any{"gpu": sim.DefaultH100MIG}},
		ManagerInterface + ".SetMIGMode":       {path: mgr, args: []any{sim.DefaultH100TS, true, opts}},
		ManagerInterface + ".SetHeterogeneous": {path: mgr, args: []any{sim.DefaultL4, true, opts}},
		ManagerInterface + ".ClearGPU":         {path: mgr, args: []any{sim.DefaultL4, opts}},
		ManagerInterface + ".SetGPUScheduler":  {path: mgr, args: []any{sim.DefaultL4, "pinned", "fixed_share", uint64(2000), opts}, emptyOK: map[int]bool{1: true}, bad: map[int]map[string]any{3: {"time slice 1µs": uint64(1), "time slice 999µs": uint64(999), "time slice 30001µs": uint64(30001), "time slice 2562047h": uint64(2562047 * 3600 * 1000000)}}},
		ManagerInterface + ".SetGPUInstanceScheduler": {path: mgr, args: []any{hostileRTXPro, rtxGI, "pinned", "fixed_share", uint64(2000), opts}, emptyOK: map[int]bool{2: true}, bad: map[int]map[string]any{
			0: {"a Hopper GPU": sim.DefaultH100MIG, "a GPU with MIG off": sim.DefaultL4},
			1: {"GPU instance -1": int32(-1), "GPU instance 4096": int32(4096), "GPU instance -2147483648": int32(-2147483648)},
			3: {"policy round_robin": "round_robin"},
			4: {"time slice 1µs": uint64(1), "time slice 999µs": uint64(999), "time slice 30001µs": uint64(30001), "time slice 2562047h": uint64(2562047 * 3600 * 1000000)}}},
		ManagerInterface + ".GetShares":      {path: mgr},
		ManagerInterface + ".GetFleetStatus": {path: mgr},
		ManagerInterface + ".Cancel":         {path: mgr, args: []any{"op-1"}},
		GPUInterface + ".SetMIGMode":         {path: GPUPath(sim.DefaultH100TS), args: []any{true, opts}},
		GPUInterface + ".SetHeterogeneous":   {path: GPUPath(sim.DefaultL4), args: []any{true, opts}},
		GPUInterface + ".Clear":              {path: GPUPath(sim.DefaultL4), args: []any{opts}},
		GPUInterface + ".SetScheduler":       {path: GPUPath(sim.DefaultL4), args: []any{"pinned", "fixed_share", uint64(2000), opts}, emptyOK: map[int]bool{0: true}, bad: map[int]map[string]any{2: {"time slice 1µs": uint64(1), "time slice 999µs": uint64(999), "time slice 30001µs": uint64(30001), "time slice 2562047h": uint64(2562047 * 3600 * 1000000)}}},
		InstanceInterface + ".Destroy":       {path: InstancePath(inst), args: []any{opts}, options: map[string]any{"detach": true}},
		InstanceInterface + ".Attach":        {path: InstancePath(inst), args: []any{"vm1", opts}, options: attach},
		InstanceInterface + ".Detach":        {path: InstancePath(inst), args: []any{opts}},
		InstanceInterface + ".GetHostdevXML": {path: InstancePath(inst)},
		TenantInterface + ".SetQuota": {path: TenantPath("acme"), args: []any{q, q, uint64(4), opts}, options: map[string]any{"unlimited": []string{QuotaInstances}},
			bad: map[int]map[string]any{3: {"unlimited quota unknown": map[string]dbus.Variant{"unlimited": dbus.MakeVariant([]string{"gpus"})}}}},
		TenantInterface + ".Undefine":                 {path: TenantPath("acme"), args: []any{true, opts}},
		propertiesInterface + ".Get":                  {path: mgr, args: []any{ManagerInterface, "Version"}},
		propertiesInterface + ".GetAll":               {path: mgr, args: []any{ManagerInterface}},
		propertiesInterface + ".Set":                  {path: mgr, args: []any{ManagerInterface, "Version", dbus.MakeVariant("x")}},
		objectManagerInterface + ".GetManagedObjects": {path: mgr},
		introspectInterface + ".Introspect":           {path: mgr},
	}
}

// hostileMetadata is migration metadata of an L4-4Q whose driver blob the
// driver does not read.
const hostileMetadata = `{"version":1,"instance":"0c5d2e41-7b6a-4f1e-8d3c-2a9b8c7d6e5f","tenant":"acme","profile":"L4-4Q","model":"L4-24GB","kind":"vgpu","flow":"vfio","typeID":803,"typeName":"L4-4Q","giProfileID":-1,"giStart":-1,"giSize":0,"domain":"vm1","domainUUID":"1e2d3c4b-5a69-4788-97a6-b5c4d3e2f100","vgpu":"bm90IHRoZSBkcml2ZXIncw=="}`

// hostileRTXPro is the RTX PRO 6000 Blackwell the hostile-input test's
// host has beside the default host's GPUs: the GPU with per-GPU-instance
// schedulers.
const hostileRTXPro = "0000:c1:00.0"

// badLayouts are layouts whose every value a pre-flight can check is
// checked before the first change: out-of-range time slices, more compute
// instances than a GPU instance holds, compute-instance names no spelling
// makes valid, GPU instance schedulers where there are none.
var badLayouts = map[string]any{
	"layout with a 1ns time slice":                          "version: v1\nlayout: [{gpu: '0000:81:00.0', scheduler: {policy: fixed_share, timeslice: 1ns}}]\n",
	"layout with a 31ms time slice":                         "version: v1\nlayout: [{gpu: '0000:81:00.0', scheduler: {policy: fixed_share, timeslice: 31ms}}]\n",
	"layout with a 2562047h time slice":                     "version: v1\nlayout: [{gpu: '0000:81:00.0', scheduler: {policy: fixed_share, timeslice: 2562047h}}]\n",
	"layout with 0c.3g.40gb":                                "version: v1\nlayout: [{gpu: '0000:41:00.0', instances: [{profile: 0c.3g.40gb, tenant: acme}]}]\n",
	"layout with 4c.3g.40gb":                                "version: v1\nlayout: [{gpu: '0000:41:00.0', instances: [{profile: 4c.3g.40gb, tenant: acme}]}]\n",
	"layout with a GPU instance scheduler on a Hopper":      "version: v1\nlayout: [{gpu: '0000:41:00.0', instances: [{profile: H100XM-1-10C, tenant: acme, scheduler: {policy: equal_share}}]}]\n",
	"layout with a GPU instance scheduler on a MIG profile": "version: v1\nlayout: [{gpu: '0000:c1:00.0', instances: [{profile: 1g.24gb, tenant: acme, scheduler: {policy: equal_share}}]}]\n",
	"layout with a 31ms GPU instance scheduler":             "version: v1\nlayout: [{gpu: '0000:c1:00.0', instances: [{profile: 'RTX Pro 6000 Blackwell DC-1-6Q', tenant: acme, scheduler: {policy: equal_share, timeslice: 31ms}}]}]\n",
	"mig-parted layout with 7 of 1c.3g.40gb":                "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1c.3g.40gb\": 7}\n",
}

// badComputeNames are compute-instance profile names no spelling makes
// valid.
var badComputeNames = map[string]any{
	"profile 0c.3g.40gb": "0c.3g.40gb", "profile 4c.3g.40gb": "4c.3g.40gb", "profile -1c.3g.40gb": "-1c.3g.40gb",
	"profile 1c.3g.40gbx": "1c.3g.40gbx", "profile 1c..3g.40gb": "1c..3g.40gb", "profile 1c.1c.3g.40gb": "1c.1c.3g.40gb",
}

// nilUUID names no instance: refused wherever an instance UUID goes.
const nilUUID = "00000000-0000-0000-0000-000000000000"

// hostileForeignMdev is an mdev vgpud did not create (mdevctl defines it):
// no create may take its UUID, in any case.
const hostileForeignMdev = "6f1d3b8c-0a52-4d6e-9b1a-3c2f5e7d9e00"

// hostileMdevctl makes the foreign mdev hostileForeignMdev on the A10, as
// mdevctl does, and fills mdevctl's directory with what is hostile there:
// its definition a FIFO (which held every discovery), and beside it a
// link to /dev/zero (endless), a link to a FIFO, a device node, a
// directory and a 300 MB file. Every call of the hostile-input test runs
// with them there.
func hostileMdevctl(t *testing.T, e *env) {
	t.Helper()
	g, err := e.m.GPU(sim.DefaultA10)
	if err != nil || len(g.VGPU.MdevParents) == 0 || len(g.VGPU.MdevParents[0].Types) == 0 {
		t.Fatalf("A10 mdev parents: %+v, %v", g.VGPU.MdevParents, err)
	}
	parent := g.VGPU.MdevParents[0]
	if err := sysfs.New(e.sim.FS()).CreateMdev(parent.PCI, parent.Types[0].ID, hostileForeignMdev); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(e.sim.MdevctlDir(), parent.PCI)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	name := func(i int) string {
		return filepath.Join(dir, fmt.Sprintf("6f1d3b8c-0a52-4d6e-9b1a-3c2f5e7d9e%02d", i))
	}
	steps := []error{
		syscall.Mkfifo(filepath.Join(dir, hostileForeignMdev), 0o644),
		os.Symlink("/dev/zero", name(1)),
		os.Symlink(filepath.Join(dir, hostileForeignMdev), name(2)),
		os.Mkdir(name(3), 0o755),
	}
	for _, err := range steps {
		if err != nil {
			t.Fatal(err)
		}
	}
	if f, err := os.Create(name(4)); err != nil || f.Truncate(300<<20) != nil || f.Close() != nil {
		t.Fatalf("huge definition: %v", err)
	}
	if err := syscall.Mknod(name(5), syscall.S_IFCHR|0o644, 1<<8|5); err != nil {
		t.Logf("no device node (%v): that entry is left out", err)
	}
	if err := e.m.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// hostileVariant is one bad call made from a valid one.
type hostileVariant struct {
	name string
	path dbus.ObjectPath
	args []any
}

// variants makes every bad call of one method: each string argument
// empty (unless documented as valid), blank, one byte too long, with a
// control character; each option unknown, of the wrong type, empty or too
// long; the object of a per-object method one that does not exist.
func (c hostileCall) variants(def *methodDef) []hostileVariant {
	var out []hostileVariant
	with := func(i int, v any) []any {
		args := append([]any(nil), c.args...)
		args[i] = v
		return args
	}
	for i, bad := range c.bad {
		for n, v := range bad {
			out = append(out, hostileVariant{name: n, path: c.path, args: with(i, v)})
		}
	}
	for i, a := range c.args {
		switch x := a.(type) {
		case string:
			lim := def.in[i].limit()
			bad := map[string]string{
				"blank":      "   ",
				"too long":   strings.Repeat("a", lim+1),
				"control":    x + "\x01",
				"surrounded": " " + x + " ",
			}
			if !c.emptyOK[i] {
				bad["empty"] = ""
			}
			if _, err := uuid.Parse(x); err == nil {
				bad["nil UUID"] = nilUUID
			}
			for n, v := range bad {
				if n == "surrounded" && def.in[i].max == maxDocument {
					continue // a document may start with blank lines
				}
				out = append(out, hostileVariant{name: fmt.Sprintf("%s %s", def.in[i].name, n), path: c.path, args: with(i, v)})
			}
		case map[string]dbus.Variant:
			opt := func(name string, o map[string]any) {
				m := map[string]dbus.Variant{}
				for k, v := range o {
					m[k] = dbus.MakeVariant(v)
				}
				out = append(out, hostileVariant{name: name, path: c.path, args: with(i, m)})
			}
			opt("unknown option", map[string]any{"no-such-option": "x"})
			opt("empty option name", map[string]any{"": "x"})
			opt("timeout-ms of the wrong type", map[string]any{OptTimeout: "10"})
			opt("timeout-ms zero", map[string]any{OptTimeout: uint64(0)})
			opt("empty operation-id", map[string]any{OptOperationID: ""})
			opt("too long operation-id", map[string]any{OptOperationID: strings.Repeat("o", maxName+1)})
			for k, v := range c.options {
				switch v.(type) {
				case string:
					if k == "uuid" {
						opt("uuid nil", map[string]any{k: nilUUID})
						opt("uuid nil in braces", map[string]any{k: "{" + nilUUID + "}"})
						opt("uuid of a foreign mdev", map[string]any{k: hostileForeignMdev})
						opt("uuid of a foreign mdev in upper case", map[string]any{k: strings.ToUpper(hostileForeignMdev)})
					}
					opt(k+" empty", map[string]any{k: ""})
					opt(k+" blank", map[string]any{k: "  "})
					opt(k+" too long", map[string]any{k: strings.Repeat("a", maxName+1)})
					opt(k+" of the wrong type", map[string]any{k: int32(1)})
				case bool:
					opt(k+" of the wrong type", map[string]any{k: "yes"})
				case []string:
					opt(k+" empty list", map[string]any{k: []string{}})
					opt(k+" empty entry", map[string]any{k: []string{""}})
					opt(k+" too long entry", map[string]any{k: []string{strings.Repeat("a", maxName+1)}})
					opt(k+" of the wrong type", map[string]any{k: "L4-4Q"})
				}
			}
		}
	}
	if len(c.args) > 0 {
		out = append(out, hostileVariant{name: "no arguments", path: c.path})
		out = append(out, hostileVariant{name: "wrong argument types", path: c.path, args: []any{int32(7)}})
	} else {
		out = append(out, hostileVariant{name: "an extra argument", path: c.path, args: []any{"x"}})
	}
	switch {
	case strings.HasPrefix(string(c.path), string(tenantDir)+"/"):
		out = append(out, hostileVariant{name: "unknown tenant object", path: TenantPath("nobody"), args: c.args})
	case strings.HasPrefix(string(c.path), string(instanceDir)+"/"):
		out = append(out, hostileVariant{name: "unknown instance object", path: InstancePath("0b0f2f4e-5d6c-4e8b-9a7d-1f2e3d4c5b6a"), args: c.args})
	case strings.HasPrefix(string(c.path), string(gpuDir)+"/"):
		out = append(out, hostileVariant{name: "unknown GPU object", path: GPUPath("0000:ff:00.0"), args: c.args})
	}
	return out
}

// TestDBusHostileInput calls every method of the API with every bad
// argument variants makes: each call gets a named error with a short
// message, and changes nothing on the host or in the store.
func TestDBusHostileInput(t *testing.T) {
	spec := sim.DefaultSpec()
	spec.GPUs = append(spec.GPUs, sim.GPUSpec{Model: "RTX-PRO-6000-BSE-96GB", PCI: hostileRTXPro, Flavour: "vfio", MIG: true})
	e := newEnvOn(t, spec, testbus.Options{}, func(e *env, o *Options) { o.Apply = NewApplier(e.m, apply.Limits{}) })
	ctx := ctxT(t)
	e.tenant("acme", unlimitedQuota())
	e.tenant("beta-keep", unlimitedQuota())
	inst := e.create("acme", "L4-4Q", "").UUID
	e.create("beta-keep", "L4-4Q", "")
	rtx, err := e.m.Instance(e.create("acme", "RTX Pro 6000 Blackwell DC-1-6Q", hostileRTXPro).UUID)
	if err != nil {
		t.Fatal(err)
	}
	hostileMdevctl(t, e)
	layout := "version: v1\ntenants:\n  - name: gamma\nlayout:\n  - gpu: \"" + sim.DefaultH100MIG + "\"\n    instances:\n      - {profile: 1g.10gb, tenant: gamma, count: 1}\n"
	calls := hostileCalls(inst, layout, int32(rtx.GIID))

	state := func() string {
		t.Helper()
		insts, err := e.m.AllInstances()
		if err != nil {
			t.Fatal(err)
		}
		tenants, err := e.m.Tenants()
		if err != nil {
			t.Fatal(err)
		}
		summary, err := e.sim.Summary()
		if err != nil {
			t.Fatal(err)
		}
		gpus, err := e.m.GPUs()
		if err != nil {
			t.Fatal(err)
		}
		var scheds []any
		for _, g := range gpus {
			scheds = append(scheds, g.Scheduler, g.GPUInstanceSchedulers)
		}
		b, _ := json.Marshal([]any{insts, tenants, scheds})
		return string(b) + "\n" + summary
	}
	before := state()
	tested := 0
	for _, ifname := range []string{ManagerInterface, GPUInterface, InstanceInterface, TenantInterface, propertiesInterface, objectManagerInterface, introspectInterface} {
		def := e.svc.ifaces[ifname]
		for _, m := range def.methods {
			if m.fn == nil {
				continue
			}
			member := ifname + "." + m.name
			c, ok := calls[member]
			if !ok {
				t.Errorf("%s has no entry in hostileCalls: add its valid call so the hostile-input test covers it", member)
				continue
			}
			standard := !strings.HasPrefix(ifname, "dev.vgpud1.")
			for _, v := range c.variants(m) {
				tested++
				call := e.client.conn.Object(BusName, v.path).CallWithContext(ctx, member, 0, v.args...)
				var de dbus.Error
				if !errors.As(call.Err, &de) {
					t.Errorf("%s, %s: %v, want a named error", member, v.name, call.Err)
					continue
				}
				named := strings.HasPrefix(de.Name, ErrorPrefix) || standard && strings.HasPrefix(de.Name, "org.freedesktop.DBus.Error.")
				if !named {
					t.Errorf("%s, %s: error %s is not one of the API's names", member, v.name, de.Name)
				}
				msg, _ := de.Body[0].(string)
				if msg == "" || len(msg) > 1024 {
					t.Errorf("%s, %s: message of %d bytes: %.200q", member, v.name, len(msg), msg)
				}
				if after := state(); after != before {
					t.Fatalf("%s, %s changed the host or the store:\n%s\nwas\n%s", member, v.name, after, before)
				}
			}
		}
	}
	t.Logf("%d hostile calls over %d methods: each refused with a named error, nothing changed", tested, len(calls))

	// With all that in mdevctl's directory, a reconcile runs, changes
	// nothing, and reports the foreign mdev with why its definition was
	// skipped.
	rep, err := e.client.Reconcile(ctx)
	if err != nil {
		t.Fatalf("reconcile with a hostile mdevctl directory: %v", err)
	}
	found := false
	for _, f := range rep.Foreign {
		if f.ID == hostileForeignMdev {
			found = strings.Contains(f.Detail, "skipped: it is a FIFO")
		}
	}
	if !found {
		t.Errorf("reconcile does not report the foreign mdev with its skipped definition: %+v", rep.Foreign)
	}
	if after := state(); after != before {
		t.Fatalf("reconcile changed the host or the store:\n%s\nwas\n%s", after, before)
	}
}

// TestDBusUnknownOptionListsEachOnce: the refusal of an unknown option
// lists the known ones, each once (the operation id is read twice).
func TestDBusUnknownOptionListsEachOnce(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	call := e.client.mgr.CallWithContext(ctxT(t), ManagerInterface+".DestroyInstance", 0,
		"9b2a6a3c-3a49-4c51-9d47-5d2a4b1f0c11", map[string]dbus.Variant{"detach-please": dbus.MakeVariant(true)})
	var de dbus.Error
	if !errors.As(call.Err, &de) || de.Name != ErrorPrefix+NameInvalidArgument {
		t.Fatalf("unknown option: %v", call.Err)
	}
	msg, _ := de.Body[0].(string)
	_, known, _ := strings.Cut(msg, "(known: ")
	if got, want := known, "detach, operation-id, timeout-ms)"; got != want {
		t.Errorf("%q lists %q, want %q", msg, got, want)
	}
}
