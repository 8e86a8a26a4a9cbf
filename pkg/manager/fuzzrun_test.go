package manager_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/internal/invariant"
	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/discover"
	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

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
	// foreignParent is where the foreign mdev fuzzForeignMdev runs.
	foreignParent string
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
	// Of the A10's type in fuzzProfiles: the A10 (time-sliced, one type at
	// a time) stays usable for the other operations.
	r.foreignParent, _ = e.foreignMdevOf(fuzzForeignMdev, "", "A10-2Q")
	if err := e.m.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	extra, missing := invariant.HostDiff(r.inventory(), nil)
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
	// refused: the step's outcome is wrong whatever it changed.
	var refused string
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
	case fuzzCreateUUID:
		id := fuzzPick(fuzzUUIDs, o.c)
		req := manager.CreateRequest{Tenant: fuzzPick(fuzzTenants, o.a), Profile: fuzzPick(fuzzProfiles, o.b), UUID: id}
		desc = fmt.Sprintf("create tenant %q profile %q uuid %q", req.Tenant, req.Profile, id)
		_, err = m.Create(ctx, req)
		_, retry := before.insts[strings.ToLower(id)]
		eff = fuzzEffect{tenant: req.Tenant, create: 1, exact: !retry}
		switch {
		case strings.EqualFold(id, fuzzForeignMdev) && !errors.Is(err, manager.ErrConflict):
			refused = fmt.Sprintf("a create with the foreign mdev's UUID: %v, want Conflict", err)
		case strings.Contains(id, "00000000-0000-0000-0000-000000000000") && !errors.Is(err, manager.ErrInvalidArgument):
			refused = fmt.Sprintf("a create with the nil UUID: %v, want InvalidArgument", err)
		}
	case fuzzMdevctl:
		kind, name := fuzzPick(hostileMdevctlKinds, o.a), fuzzPick(fuzzMdevctlNames, o.b)
		desc = fmt.Sprintf("mdevctl directory: %s as %s, then reconcile", kind, name)
		if plantHostileMdevctl(r.t, r.e.sim.MdevctlDir(), r.foreignParent, name, kind) {
			_, err = m.Reconcile(ctx)
			if err != nil {
				refused = fmt.Sprintf("reconcile with a hostile mdevctl entry: %v", err)
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
	if refused != "" {
		problems = append(problems, refused)
	}
	if got := r.e.mdevOn(fuzzForeignMdev); got != r.foreignParent {
		problems = append(problems, fmt.Sprintf("the foreign mdev %s is on %q, not on %s where it ran", fuzzForeignMdev, got, r.foreignParent))
	}
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

func (r *fuzzRun) inventory() gpu.Inventory {
	r.t.Helper()
	inv, err := r.host.Inventory(context.Background())
	if err != nil {
		r.t.Fatalf("discover the simulated host: %v", err)
	}
	return inv
}
