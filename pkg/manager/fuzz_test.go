package manager_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/discover"
	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// FuzzManagerOperations drives the manager on the simulated host with a
// sequence of operations, valid and hostile alike (empty, whitespace,
// unknown and malformed tenants, profiles, GPUs, VMs, instance ids), and
// after every step checks what the crash test checks after a restart: no
// intent left, every record ready, the store and the host agreeing both
// ways (discovered through NVML and sysfs), attachments and the VMs'
// configs agreeing both ways, each tenant's usage the catalog's sum over
// its instances. It also checks that each step changed only what its
// operation may change, whether it succeeded or not: a refused operation
// changes nothing (a forced undefine may have destroyed some of its own
// tenant's instances), and no operation touches another tenant's
// instances, or, for apply, GPUs its document does not describe. Every
// refusal wraps one of the manager's sentinels, and none is a backend
// failure: nothing fails on the simulated host.
//
// The input is a program of up to fuzzMaxOps operations of 4 bytes each
// (fuzzOp). The seeds run with `go test`; `make fuzz` explores further.
func FuzzManagerOperations(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s.program())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := newFuzzRun(t)
		for i, o := range decodeFuzzProgram(data) {
			r.step(i, o)
		}
	})
}

// fuzzMaxOps bounds one execution (each step also discovers the host).
const fuzzMaxOps = 16

// The operations, by the first byte of a fuzzOp (modulo their number).
const (
	fuzzDefine byte = iota
	fuzzUndefine
	fuzzCreate
	fuzzDestroy
	fuzzAttach
	fuzzDetach
	fuzzDefragment
	fuzzApply
	fuzzCreateAttach
	fuzzOpCount
)

// fuzzOp is one operation; a, b and c pick its arguments from the tables
// below (modulo their length), as step says for each operation.
type fuzzOp struct{ code, a, b, c byte }

func decodeFuzzProgram(data []byte) []fuzzOp {
	var ops []fuzzOp
	for len(data) >= 4 && len(ops) < fuzzMaxOps {
		ops = append(ops, fuzzOp{data[0] % fuzzOpCount, data[1], data[2], data[3]})
		data = data[4:]
	}
	return ops
}

// The argument tables (fuzzSeeds names the entries it uses).
var (
	fuzzTenants  = []string{"alpha", "beta", "gamma", "", " ", "alpha ", "ALPHA", "a_b", strings.Repeat("a", 300), "-"}
	fuzzProfiles = []string{"1g.10gb", "2g.20gb", "3g.40gb", "H100XM-1-10C", "H100XM-10C", "L4-2Q", "A10-2Q", "passthrough",
		"", " ", "1g.10gb ", "9g.900gb", "L4-24GB/passthrough", "NVIDIA A10-8Q"}
	fuzzGPUs = []string{"", h100MIG, h100TS, l4, a10, "0", "3", "9", " ", "0000:ff:00.0", "GPU-00000000-0000-0000-0000-000000000000"}
	fuzzVMs  = []string{"vm1", "vm2", "", " ", "nosuch", "qemu:///system/vm1", "qemu:///elsewhere/vm1", "vm1\n", "VM1"}
)

// fuzzUnknownID is an instance UUID no instance has.
const fuzzUnknownID = "00000000-0000-4000-8000-00000000f00d"

// fuzzDoc is an apply document with what it may touch: the GPUs it
// describes, and whether it prunes tenants it does not list.
type fuzzDoc struct {
	name, selectConfig, data string
	covers                   []string
	tenants                  []string
	prune                    bool
}

var fuzzDocs = []fuzzDoc{
	{name: "l4-a10", data: `version: v1
tenants:
  - {name: alpha, ensure: true}
  - {name: beta, ensure: true}
layout:
  - gpu: "0000:81:00.0"
    instances:
      - {profile: L4-2Q, tenant: alpha, count: 2}
  - gpu: "0000:a1:00.0"
    instances:
      - {profile: A10-2Q, tenant: beta, count: 1}
`, covers: []string{l4, a10}, tenants: []string{"alpha", "beta"}},
	{name: "prune-mig", data: `version: v1
prune: true
tenants:
  - {name: alpha, ensure: true}
layout:
  - gpu: "0000:41:00.0"
    mig: true
    instances:
      - {profile: 1g.10gb, tenant: alpha, count: 2}
`, covers: []string{h100MIG}, tenants: []string{"alpha"}, prune: true},
	{name: "all-empty", data: `version: v1
layout:
  - all: true
    instances: []
`, covers: []string{h100MIG, h100TS, l4, a10}},
	{name: "empty-tenant", data: `version: v1
layout:
  - gpu: "0000:81:00.0"
    instances:
      - {profile: L4-2Q, tenant: "", count: 1}
`, covers: []string{l4}},
	{name: "mig-parted", selectConfig: "gpu0-3g.40gb@beta", data: `version: v1
mig-configs:
  gpu0-3g.40gb:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "3g.40gb": 2
`, covers: []string{h100MIG}, tenants: []string{"beta"}},
	{name: "mig-parted-no-tenant", selectConfig: "gpu0-3g.40gb@", data: `version: v1
mig-configs:
  gpu0-3g.40gb:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "3g.40gb": 2
`, covers: []string{h100MIG}},
	{name: "unknown-gpu", data: `version: v1
layout:
  - gpu: "0000:ff:00.0"
    instances:
      - {profile: L4-2Q, tenant: alpha, count: 1}
`},
	{name: "unnamed-tenant", data: `version: v1
prune: true
tenants:
  - {name: ""}
`, prune: true},
}

// A seed is a named program.
type fuzzSeed struct {
	name string
	ops  []fuzzOp
}

func (s fuzzSeed) program() []byte {
	var b []byte
	for _, o := range s.ops {
		b = append(b, o.code, o.a, o.b, o.c)
	}
	return b
}

// fuzzSeeds run with `go test` in this order (seed#0, seed#1, ...).
func fuzzSeeds() []fuzzSeed {
	// Entries of the argument tables and documents the seeds use.
	const (
		tAlpha, tBeta, tGamma, tEmpty, tSpace, tTrailing, tUpper    = 0, 1, 2, 3, 4, 5, 6
		pMIG1, pMIG3, pMIGVGPU, pL4, pA10, pEmpty, pSpace, pUnknown = 0, 2, 3, 5, 6, 8, 9, 11
		gAny, gMIG, gUnknown                                        = 0, 1, 9
		vm1, vm2, vmEmpty, vmURI                                    = 0, 1, 2, 5
		iEmpty, iSpace, iUnknown, iMalformed, iUpper, iSpaced       = 0x80, 0x81, 0x82, 0x83, 0x84, 0x85
		docL4A10, docPruneMIG, docAllEmpty, docEmptyTenant          = 0, 1, 2, 3
	)
	// iNth refers to the nth existing instance.
	iNth := func(n int) byte { return byte(8 * n) }
	op := func(code, a, b, c byte) fuzzOp { return fuzzOp{code, a, b, c} }
	return []fuzzSeed{
		// Two tenants with an instance each; undefining the tenant named ""
		// by force must destroy nothing.
		{"undefine-empty-tenant-force", []fuzzOp{
			op(fuzzCreate, tAlpha, pL4, gAny), op(fuzzCreate, tBeta, pA10, gAny),
			op(fuzzUndefine, tEmpty, 0, 1),
			op(fuzzUndefine, tSpace, 0, 1), op(fuzzUndefine, tUpper, 0, 1), op(fuzzUndefine, tTrailing, 0, 1), op(fuzzUndefine, tGamma, 0, 1),
		}},
		{"undefine-refused", []fuzzOp{
			op(fuzzCreate, tAlpha, pMIG1, gAny), op(fuzzCreate, tBeta, pMIG1, gAny),
			op(fuzzUndefine, tEmpty, 0, 0), op(fuzzUndefine, tAlpha, 0, 0), op(fuzzUndefine, tBeta, 0, 1), op(fuzzUndefine, tBeta, 0, 1),
		}},
		{"create-odd-arguments", []fuzzOp{
			op(fuzzCreate, tEmpty, pMIG1, gAny), op(fuzzCreate, tSpace, pMIG1, gAny), op(fuzzCreate, tTrailing, pMIG1, gAny),
			op(fuzzCreate, tAlpha, pEmpty, gAny), op(fuzzCreate, tAlpha, pSpace, gAny), op(fuzzCreate, tAlpha, pUnknown, gAny),
			op(fuzzCreate, tAlpha, 10, gAny), op(fuzzCreate, tAlpha, pMIG1, gUnknown), op(fuzzCreate, tAlpha, pMIG1, 8),
			op(fuzzCreate, tAlpha, pMIG1, gMIG), op(fuzzCreate, tGamma, pMIG1, gAny), op(fuzzCreate, tAlpha, 7, gAny),
		}},
		{"attach-detach", []fuzzOp{
			op(fuzzCreate, tAlpha, pMIGVGPU, gAny), op(fuzzAttach, iNth(0), vm1, 0), op(fuzzAttach, iNth(0), vm2, 0),
			op(fuzzAttach, iNth(0), vmEmpty, 0), op(fuzzDestroy, iNth(0), 0, 0), op(fuzzDetach, iNth(0), 0, 0), op(fuzzDetach, iNth(0), 0, 0),
			op(fuzzAttach, iNth(0), vmURI, 0), op(fuzzAttach, iNth(0), 6, 0), op(fuzzAttach, iNth(0), 7, 0), op(fuzzAttach, iNth(0), 8, 0),
			op(fuzzAttach, iEmpty, vm1, 0), op(fuzzDetach, iUnknown, 0, 0), op(fuzzDestroy, iNth(0), 1, 0),
		}},
		{"destroy-odd-ids", []fuzzOp{
			op(fuzzCreate, tAlpha, pL4, gAny), op(fuzzCreate, tBeta, pA10, gAny),
			op(fuzzDestroy, iEmpty, 0, 0), op(fuzzDestroy, iSpace, 1, 0), op(fuzzDestroy, iUnknown, 0, 0), op(fuzzDestroy, iMalformed, 0, 0),
			op(fuzzDestroy, iSpaced, 0, 0), op(fuzzDestroy, iUpper, 0, 0), op(fuzzDestroy, iNth(0), 0, 0), op(fuzzDestroy, iNth(0), 0, 0),
		}},
		{"defragment", []fuzzOp{
			op(fuzzCreate, tAlpha, pMIG1, gMIG), op(fuzzCreate, tAlpha, pMIG1, gMIG), op(fuzzCreate, tBeta, pMIG1, gMIG),
			op(fuzzCreate, tAlpha, pMIG1, gMIG), op(fuzzCreate, tBeta, pMIG1, gMIG), op(fuzzCreate, tAlpha, pMIG1, gMIG),
			op(fuzzDestroy, iNth(0), 0, 0), op(fuzzDestroy, iNth(1), 0, 0), op(fuzzDestroy, iNth(2), 0, 0),
			op(fuzzDefragment, pMIG3, tEmpty, gAny), op(fuzzDefragment, pMIG3, tAlpha, gUnknown), op(fuzzDefragment, pEmpty, tAlpha, gAny),
			op(fuzzDefragment, pMIG3, tGamma, gAny), op(fuzzDefragment, pMIG3, tAlpha, gMIG), op(fuzzCreate, tAlpha, pMIG3, gMIG),
		}},
		{"apply-documents", []fuzzOp{
			op(fuzzCreate, tBeta, pL4, gAny), op(fuzzApply, docEmptyTenant, 0, 0), op(fuzzApply, docL4A10, 0, 0),
			op(fuzzApply, docPruneMIG, 0, 0), op(fuzzApply, 4, 0, 0), op(fuzzApply, 5, 0, 0), op(fuzzApply, 6, 0, 0),
			op(fuzzApply, 7, 0, 0), op(fuzzApply, docAllEmpty, 0, 0),
		}},
		{"create-and-attach", []fuzzOp{
			op(fuzzCreateAttach, tAlpha, pL4, vm1), op(fuzzCreateAttach, tEmpty, pL4, vm1), op(fuzzCreateAttach, tAlpha, pEmpty, vm1),
			op(fuzzCreateAttach, tAlpha, pL4, vmEmpty), op(fuzzCreateAttach, tAlpha, pMIG1, vm2), op(fuzzCreateAttach, tBeta, pA10, 4),
			op(fuzzUndefine, tAlpha, 0, 1),
		}},
		{"tenant-lifecycle", []fuzzOp{
			op(fuzzDefine, tGamma, 1, 0), op(fuzzDefine, tEmpty, 0, 0), op(fuzzDefine, tSpace, 0, 0), op(fuzzDefine, tUpper, 0, 0),
			op(fuzzDefine, tGamma, 2, 0), op(fuzzCreate, tGamma, pA10, gAny), op(fuzzCreate, tGamma, pA10, gAny), op(fuzzCreate, tGamma, pA10, gAny),
			op(fuzzUndefine, tGamma, 0, 0), op(fuzzUndefine, tGamma, 0, 1), op(fuzzCreate, tGamma, pA10, gAny),
		}},
	}
}

// fuzzRun is one execution: a manager on the default simulated host with
// tenants alpha and beta, libvirt with two stopped VMs, and an independent
// view of the host through the production NVML and sysfs backends.
type fuzzRun struct {
	t       *testing.T
	e       *env
	lv      *fuzzVirt
	host    discover.Host
	journal []string
	// foreign is what the host held before the first step.
	foreign []string
	// checked is the host's generation and the records at the last
	// comparison of the two, which a step that changed neither need not
	// repeat (discovery is most of a step's time).
	checkedGen  uint64
	checkedRecs string
}

func newFuzzRun(t *testing.T) *fuzzRun {
	e := newEnv(t, nil)
	e.tenant("alpha", unlimited())
	e.tenant("beta", unlimited())
	lv := &fuzzVirt{vms: map[string]*fuzzVM{
		"vm1": {uuid: "6f1ad3a0-0000-4000-8000-000000000001", devs: map[string]string{}},
		"vm2": {uuid: "6f1ad3a0-0000-4000-8000-000000000002", devs: map[string]string{}},
	}}
	e.m.SetVirt(lv)
	b := nvmlb.New(e.sim.NVML(), e.cat, nvmlb.Options{})
	if err := b.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := &fuzzRun{t: t, e: e, lv: lv, host: discover.Host{NVML: b, Sysfs: sysfs.New(e.sim.FS())}}
	extra, missing := fuzzHostDiff(r.inventory(), nil)
	if len(missing) != 0 {
		t.Fatalf("host before the first step: %v", missing)
	}
	r.foreign = extra
	return r
}

// fuzzState is the store's content.
type fuzzState struct {
	tenants map[string]store.Tenant
	insts   map[string]store.Instance
	atts    map[string]store.Attachment
	intents []store.Intent
}

func (r *fuzzRun) read() fuzzState {
	r.t.Helper()
	s := fuzzState{tenants: map[string]store.Tenant{}, insts: map[string]store.Instance{}, atts: map[string]store.Attachment{}}
	err := r.e.db.View(func(tx *store.Tx) error {
		ts, err := tx.Tenants()
		if err != nil {
			return err
		}
		for _, x := range ts {
			s.tenants[x.Name] = x
		}
		is, err := tx.Instances()
		if err != nil {
			return err
		}
		for _, x := range is {
			s.insts[x.UUID] = x
		}
		as, err := tx.Attachments()
		if err != nil {
			return err
		}
		for _, x := range as {
			s.atts[x.Instance] = x
		}
		s.intents, err = tx.Intents()
		return err
	})
	if err != nil {
		r.t.Fatalf("read the store: %v", err)
	}
	return s
}

// ids lists the instances in creation order.
func (s fuzzState) ids() []string {
	var out []string
	for id := range s.insts {
		out = append(out, id)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := s.insts[out[i]], s.insts[out[j]]
		if !a.Created.Equal(b.Created) {
			return a.Created.Before(b.Created)
		}
		return a.UUID < b.UUID
	})
	return out
}

// fuzzInstanceRef turns the a byte of destroy, attach and detach into an
// instance reference and the instance it names ("" for none): below 0x80
// an existing instance, the (a/8)th in creation order; from 0x80 on, by
// a%8: "", " ", an unknown UUID, "not-a-uuid", an existing id in upper
// case or with a leading space.
func fuzzInstanceRef(s fuzzState, a byte) (ref, target string) {
	ids := s.ids()
	nth := func() string {
		if len(ids) == 0 {
			return ""
		}
		return ids[int(a/8)%len(ids)]
	}
	if a < 0x80 {
		id := nth()
		return id, id
	}
	switch a % 8 {
	case 0:
		return "", ""
	case 1:
		return " ", ""
	case 2:
		return fuzzUnknownID, ""
	case 3:
		return "not-a-uuid", ""
	case 4, 6:
		id := nth()
		return strings.ToUpper(id), id
	default:
		id := nth()
		return " " + id, id
	}
}

func fuzzPick(list []string, b byte) string { return list[int(b)%len(list)] }

// fuzzEffect is what a step may change.
type fuzzEffect struct {
	// tenant is the only tenant whose instances it may destroy or create
	// ("" none); anyTenant lifts that for apply (bounded by gpus).
	tenant    string
	anyTenant bool
	// gpus bounds the GPUs whose instances apply may create or destroy.
	gpus []string
	// create and destroy: how many instances it may create, and which it
	// may destroy (on success exactly these).
	create  int
	destroy func(in store.Instance) bool
	exact   bool // success means exactly create new, all of destroy gone
	// attach: the instance whose attachment may change, and to what VM
	// on success ("" for detached).
	attach, attachVM string
	// move: instances may change placement (defragment).
	move bool
	// needTarget: it names one existing instance, so it cannot succeed
	// when the reference names none.
	needTarget bool
	target     string
	// tenants it may add and remove.
	addTenants, removeTenants []string
	// pruneOthers: apply may undefine the tenants its document lacks.
	pruneOthers []string
}

// step runs one operation and checks the invariants and its effect.
func (r *fuzzRun) step(i int, o fuzzOp) {
	ctx := context.Background()
	before := r.read()
	m := r.e.m
	var err error
	var desc string
	var eff fuzzEffect
	switch o.code {
	case fuzzDefine:
		name := fuzzPick(fuzzTenants, o.a)
		q := []tenant.Quota{unlimited(),
			{VRAMBytes: 20 << 30, ComputeMilli: tenant.Unlimited, MaxInstances: 2},
			{VRAMBytes: tenant.Unlimited, ComputeMilli: 500, MaxInstances: tenant.Unlimited}}[int(o.b)%3]
		desc = fmt.Sprintf("define tenant %q quota %s", name, q.String())
		_, err = m.DefineTenant(ctx, tenant.Tenant{Name: name, Quota: q})
		eff = fuzzEffect{addTenants: []string{name}, exact: true}
	case fuzzUndefine:
		name, force := fuzzPick(fuzzTenants, o.a), o.c&1 == 1
		desc = fmt.Sprintf("undefine tenant %q force=%v", name, force)
		err = m.UndefineTenant(ctx, name, force)
		eff = fuzzEffect{tenant: name, removeTenants: []string{name}, exact: true}
		if force {
			eff.destroy = func(in store.Instance) bool { return in.Tenant == name }
		}
	case fuzzCreate:
		req := manager.CreateRequest{Tenant: fuzzPick(fuzzTenants, o.a), Profile: fuzzPick(fuzzProfiles, o.b), GPU: fuzzPick(fuzzGPUs, o.c)}
		desc = fmt.Sprintf("create tenant %q profile %q gpu %q", req.Tenant, req.Profile, req.GPU)
		_, err = m.Create(ctx, req)
		eff = fuzzEffect{tenant: req.Tenant, create: 1, exact: true}
	case fuzzDestroy:
		ref, target := fuzzInstanceRef(before, o.a)
		detach := o.b&1 == 1
		desc = fmt.Sprintf("destroy %q detach=%v", ref, detach)
		err = m.Destroy(ctx, ref, manager.DestroyOptions{Detach: detach})
		eff = fuzzEffect{tenant: before.insts[target].Tenant, exact: true, destroy: func(in store.Instance) bool { return target != "" && in.UUID == target },
			needTarget: true, target: target}
		if detach {
			eff.attach = target
		}
	case fuzzAttach:
		ref, target := fuzzInstanceRef(before, o.a)
		vm := fuzzPick(fuzzVMs, o.b)
		desc = fmt.Sprintf("attach %q to %q", ref, vm)
		_, err = m.Attach(ctx, ref, vm, manager.AttachOptions{})
		eff = fuzzEffect{attach: target, attachVM: r.lv.resolve(vm), needTarget: true, target: target}
	case fuzzDetach:
		ref, target := fuzzInstanceRef(before, o.a)
		desc = fmt.Sprintf("detach %q", ref)
		err = m.Detach(ctx, ref)
		eff = fuzzEffect{attach: target, needTarget: true, target: target}
	case fuzzDefragment:
		req := manager.CreateRequest{Profile: fuzzPick(fuzzProfiles, o.a), Tenant: fuzzPick(fuzzTenants, o.b), GPU: fuzzPick(fuzzGPUs, o.c)}
		desc = fmt.Sprintf("defragment for tenant %q profile %q gpu %q", req.Tenant, req.Profile, req.GPU)
		_, err = m.Defragment(ctx, req, true)
		eff = fuzzEffect{move: true}
	case fuzzApply:
		d := fuzzDocs[int(o.a)%len(fuzzDocs)]
		desc = fmt.Sprintf("apply %s", d.name)
		err = applyFuzzDoc(ctx, m, d)
		eff = fuzzEffect{anyTenant: true, gpus: d.covers, create: 64, destroy: func(store.Instance) bool { return true }, addTenants: d.tenants}
		if d.prune {
			for name := range before.tenants {
				if !slices.Contains(d.tenants, name) {
					eff.pruneOthers = append(eff.pruneOthers, name)
				}
			}
		}
	case fuzzCreateAttach:
		req := manager.CreateRequest{Tenant: fuzzPick(fuzzTenants, o.a), Profile: fuzzPick(fuzzProfiles, o.b)}
		vm := fuzzPick(fuzzVMs, o.c)
		desc = fmt.Sprintf("create-and-attach tenant %q profile %q to %q", req.Tenant, req.Profile, vm)
		_, _, err = m.CreateAndAttach(ctx, req, vm, manager.AttachOptions{})
		eff = fuzzEffect{tenant: req.Tenant, create: 1, exact: true, attachVM: r.lv.resolve(vm)}
	}
	res := "ok"
	if err != nil {
		res = manager.Name(err) + ": " + err.Error()
	}
	r.journal = append(r.journal, fmt.Sprintf("%d %s -> %s", i, desc, res))
	after := r.read()
	var problems []string
	problems = append(problems, fuzzErrorProblems(err)...)
	problems = append(problems, r.invariants(after)...)
	problems = append(problems, fuzzEffectProblems(before, after, eff, err)...)
	if len(problems) > 0 {
		r.t.Fatalf("after step %d (%s):\n  %s\nsteps:\n  %s", i, desc, strings.Join(problems, "\n  "), strings.Join(r.journal, "\n  "))
	}
}

func applyFuzzDoc(ctx context.Context, m *manager.Manager, d fuzzDoc) error {
	desired, err := apply.Parse(d.name+".yaml", []byte(d.data), d.selectConfig)
	if err != nil {
		return err
	}
	cs, err := apply.Diff(ctx, m, desired)
	if err != nil {
		return err
	}
	_, err = apply.Execute(ctx, m, cs)
	return err
}

// fuzzErrorProblems: a refusal names what was wrong with one of the manager's
// sentinels; on the simulated host no backend fails.
func fuzzErrorProblems(err error) []string {
	if err == nil {
		return nil
	}
	for _, s := range []error{manager.ErrNotFound, manager.ErrInvalidArgument, manager.ErrQuotaExceeded, manager.ErrNoCapacity,
		manager.ErrAccessDenied, manager.ErrBusy, manager.ErrConflict, manager.ErrGPULost} {
		if errors.Is(err, s) {
			return nil
		}
	}
	if errors.Is(err, manager.ErrBackendFailure) {
		return []string{fmt.Sprintf("a backend failure on the simulated host: %v", err)}
	}
	return []string{fmt.Sprintf("error with no sentinel: %v", err)}
}

// invariants are the crash test's checks, on the state after a step.
func (r *fuzzRun) invariants(s fuzzState) []string {
	var out []string
	for _, in := range s.intents {
		out = append(out, fmt.Sprintf("intent %s (%s %s, steps %v) left", in.ID, in.Op, in.Instance, in.Steps))
	}
	for _, in := range s.insts {
		if in.State != store.StateReady {
			out = append(out, fmt.Sprintf("instance %s is %s: %s", in.UUID, in.State, in.Reason))
		}
		if _, ok := s.tenants[in.Tenant]; !ok {
			out = append(out, fmt.Sprintf("instance %s belongs to tenant %q, which is not defined", in.UUID, in.Tenant))
		}
	}
	for id, a := range s.atts {
		if _, ok := s.insts[id]; !ok {
			out = append(out, fmt.Sprintf("attachment of instance %s to %s has no instance record", id, a.Domain))
		}
	}

	// Records against the host, both ways.
	var recs []store.Instance
	for _, in := range s.insts {
		recs = append(recs, in)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].UUID < recs[j].UUID })
	gen, err := r.e.sim.Generation()
	if err != nil {
		r.t.Fatal(err)
	}
	if key := fmt.Sprint(recs); gen != r.checkedGen || key != r.checkedRecs {
		extra, missing := fuzzHostDiff(r.inventory(), recs)
		for _, d := range extra {
			if !slices.Contains(r.foreign, d) {
				out = append(out, "on the host without a record: "+d)
			}
		}
		out = append(out, missing...)
		r.checkedGen, r.checkedRecs = gen, key
	}

	// Attachment records against the VMs' configs, both ways.
	out = append(out, r.lv.diff(s)...)

	// Usage as the manager reports it against the catalog.
	views, err := r.e.m.Tenants()
	if err != nil {
		return append(out, fmt.Sprintf("list tenants: %v", err))
	}
	if len(views) != len(s.tenants) {
		out = append(out, fmt.Sprintf("the manager lists %d tenants, the store holds %d", len(views), len(s.tenants)))
	}
	for _, v := range views {
		var want tenant.Usage
		for _, in := range s.insts {
			if in.Tenant != v.Name {
				continue
			}
			vram, compute, err := fuzzCost(r.e.cat, in)
			if err != nil {
				out = append(out, err.Error())
			}
			want.VRAMBytes += vram
			want.ComputeMilli += compute
			want.Instances++
		}
		if v.Usage != want {
			out = append(out, fmt.Sprintf("tenant %s reports usage %+v; its instances cost %+v by the catalog", v.Name, v.Usage, want))
		}
	}
	return out
}

func (r *fuzzRun) inventory() gpu.Inventory {
	r.t.Helper()
	inv, err := r.host.Inventory(context.Background())
	if err != nil {
		r.t.Fatalf("discover the simulated host: %v", err)
	}
	return inv
}

// fuzzEffectProblems checks that a step changed only what its operation may.
func fuzzEffectProblems(before, after fuzzState, eff fuzzEffect, err error) []string {
	var out []string
	ok := err == nil
	onGPU := func(in store.Instance) bool {
		return eff.anyTenant && (slices.Contains(eff.gpus, in.GPUPCI) || slices.Contains(eff.gpus, in.GPUUUID))
	}
	mayTouch := func(in store.Instance) bool {
		return onGPU(in) || (!eff.anyTenant && eff.tenant != "" && in.Tenant == eff.tenant)
	}

	if ok && eff.needTarget && eff.target == "" {
		out = append(out, "succeeded, but the reference names no instance")
	}

	// Instances destroyed.
	var gone []string
	for id, in := range before.insts {
		if _, still := after.insts[id]; still {
			continue
		}
		gone = append(gone, id)
		switch {
		case eff.destroy == nil || !eff.destroy(in) || !mayTouch(in):
			out = append(out, fmt.Sprintf("instance %s of tenant %s (%s on %s) was destroyed", id, in.Tenant, in.Profile, in.GPUPCI))
		}
	}
	if ok && eff.exact && eff.destroy != nil {
		for id, in := range before.insts {
			if _, still := after.insts[id]; still && eff.destroy(in) {
				out = append(out, fmt.Sprintf("instance %s is still there after its destroy succeeded", id))
			}
		}
	}

	// Instances created.
	var made []store.Instance
	for id, in := range after.insts {
		if _, had := before.insts[id]; had {
			continue
		}
		made = append(made, in)
		switch {
		case !ok && !eff.anyTenant:
			out = append(out, fmt.Sprintf("instance %s (%s of tenant %s) was created by a refused operation", id, in.Profile, in.Tenant))
		case !mayTouch(in):
			out = append(out, fmt.Sprintf("instance %s (%s of tenant %s on %s) was created", id, in.Profile, in.Tenant, in.GPUPCI))
		}
	}
	if len(made) > eff.create {
		out = append(out, fmt.Sprintf("%d instances created, at most %d expected", len(made), eff.create))
	}
	if ok && eff.exact && eff.create > 0 && len(made) != eff.create {
		out = append(out, fmt.Sprintf("%d instances created by a create that succeeded", len(made)))
	}

	// Instances kept: same owner and profile; the same placement unless
	// moved by a defragment that succeeded.
	for id, a := range before.insts {
		b, ok2 := after.insts[id]
		if !ok2 {
			continue
		}
		if a.Tenant != b.Tenant || a.Profile != b.Profile || a.Kind != b.Kind {
			out = append(out, fmt.Sprintf("instance %s changed from %s/%s/%s to %s/%s/%s", id, a.Tenant, a.Kind, a.Profile, b.Tenant, b.Kind, b.Profile))
		}
		if fuzzPlacement(a) != fuzzPlacement(b) && !(eff.move && ok) {
			out = append(out, fmt.Sprintf("instance %s moved from %s to %s", id, fuzzPlacement(a), fuzzPlacement(b)))
		}
	}

	// Attachments.
	for id, a := range before.atts {
		b, still := after.atts[id]
		switch {
		case !still && slices.Contains(gone, id):
		case !still && id == eff.attach && (ok || eff.destroy != nil):
			// a detach, or the detach half of a destroy with detach
		case !still:
			out = append(out, fmt.Sprintf("attachment of %s to %s was dropped", id, a.Domain))
		case b.Domain != a.Domain || b.DomainUUID != a.DomainUUID:
			out = append(out, fmt.Sprintf("attachment of %s moved from %s to %s", id, a.Domain, b.Domain))
		}
	}
	for id, b := range after.atts {
		if _, had := before.atts[id]; had {
			continue
		}
		isNew := slices.ContainsFunc(made, func(in store.Instance) bool { return in.UUID == id })
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("a refused operation attached %s to %s", id, b.Domain))
		case (id == eff.attach || isNew) && eff.attachVM != "" && b.Domain == eff.attachVM:
		default:
			out = append(out, fmt.Sprintf("instance %s was attached to %s", id, b.Domain))
		}
	}
	if ok && eff.attachVM != "" {
		attached := eff.attach
		if len(made) == 1 {
			attached = made[0].UUID
		}
		if a, held := after.atts[attached]; !held || a.Domain != eff.attachVM {
			out = append(out, fmt.Sprintf("instance %s is not attached to %s after the call succeeded", attached, eff.attachVM))
		}
	}
	if ok && eff.attach != "" && eff.attachVM == "" && eff.destroy == nil {
		if _, still := after.atts[eff.attach]; still {
			out = append(out, fmt.Sprintf("instance %s is still attached after its detach succeeded", eff.attach))
		}
	}

	// Tenants.
	if ok && eff.exact {
		for _, name := range eff.addTenants {
			if _, there := after.tenants[name]; !there {
				out = append(out, fmt.Sprintf("tenant %q is not there after its define succeeded", name))
			}
		}
		for _, name := range eff.removeTenants {
			if _, there := after.tenants[name]; there {
				out = append(out, fmt.Sprintf("tenant %q is still there after its undefine succeeded", name))
			}
		}
	}
	for name := range before.tenants {
		if _, still := after.tenants[name]; still {
			continue
		}
		if !(ok && slices.Contains(eff.removeTenants, name)) && !slices.Contains(eff.pruneOthers, name) {
			out = append(out, fmt.Sprintf("tenant %s was undefined", name))
		}
	}
	for name := range after.tenants {
		if _, had := before.tenants[name]; had {
			continue
		}
		if !slices.Contains(eff.addTenants, name) || (!ok && !eff.anyTenant) {
			out = append(out, fmt.Sprintf("tenant %q was defined", name))
		}
	}
	return out
}

func fuzzPlacement(in store.Instance) string {
	return fmt.Sprintf("%s slot %d profile %d vf %q mdev %q", in.GPUPCI, in.GIStart, in.GIProfileID, in.VF, in.MdevUUID)
}
