package apply_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// hostState is everything an apply may change: the simulated host's
// devices and MIG modes, and the store's tenants and instance records.
func hostState(e *env) string {
	e.t.Helper()
	var b strings.Builder
	b.WriteString(e.summary())
	ts, err := e.m.Tenants()
	if err != nil {
		e.t.Fatal(err)
	}
	var lines []string
	for _, t := range ts {
		lines = append(lines, fmt.Sprintf("tenant %s %s", t.Name, t.Quota))
	}
	insts, err := e.m.AllInstances()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, in := range insts {
		lines = append(lines, fmt.Sprintf("instance %s %s %s %s %s", in.UUID, in.Tenant, in.Profile, in.GPUPCI, in.State))
	}
	gpus, err := e.m.GPUs()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, g := range gpus {
		if g.Scheduler != nil {
			lines = append(lines, fmt.Sprintf("scheduler %s %+v", g.PCI, *g.Scheduler))
		}
	}
	sort.Strings(lines)
	b.WriteString(strings.Join(lines, "\n"))
	return b.String()
}

// executeRefused executes cs and checks that it is refused before its
// first change, with kind and a message containing want, and that the
// host and the store are as they were.
func executeRefused(t *testing.T, e *env, cs apply.ChangeSet, lim apply.Limits, kind error, want ...string) {
	t.Helper()
	before := hostState(e)
	res, err := apply.ExecuteWith(context.Background(), e.m, cs, lim)
	if !errors.Is(err, kind) {
		t.Fatalf("execute: error %v, want %v", err, kind)
	}
	var pe *apply.PreflightError
	if !errors.As(err, &pe) {
		t.Fatalf("execute: error %T %v is not a pre-flight refusal", err, err)
	}
	if len(res.Done) != 0 || res.Failed != nil || res.Remaining != len(cs.Changes) || res.Error == "" {
		t.Fatalf("result %+v: changes were made or attempted", res)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("execute: error %q lacks %q", err, w)
		}
	}
	if after := hostState(e); after != before {
		t.Fatalf("a refused change set changed the host or the store:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// layoutDoc is a vgpud document giving the tenant acme (with the quota
// fields in quota, if any) the instances on one GPU ("PROFILE×N").
func layoutDoc(gpuPCI, quota string, instances ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "version: v1\ntenants:\n  - name: acme\n%slayout:\n  - gpu: %q\n    instances:\n", quota, gpuPCI)
	for _, in := range instances {
		p, n, _ := strings.Cut(in, "×")
		fmt.Fprintf(&b, "      - {profile: %s, tenant: acme, count: %s}\n", p, n)
	}
	return b.String()
}

func parseDoc(t *testing.T, doc string) *apply.Desired {
	t.Helper()
	d, err := apply.Parse("layout.yaml", []byte(doc), "")
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, doc)
	}
	return d
}

// another is one more create of profile: a copy of one the change set
// has, or the first create with the profile replaced.
func another(t *testing.T, cs apply.ChangeSet, profile string) apply.Change {
	t.Helper()
	for _, c := range cs.Changes {
		if c.Op == apply.OpCreate && c.Profile == profile {
			c.Instance = ""
			return c
		}
	}
	for _, c := range cs.Changes {
		if c.Op == apply.OpCreate {
			c.Profile, c.Instance = profile, ""
			return c
		}
	}
	t.Fatalf("no create in\n%s", cs)
	return apply.Change{}
}

// tenantsOnL4 is a document in which each of n tenants asks for an L4-1Q
// on the one L4.
func tenantsOnL4(n int) string {
	var doc strings.Builder
	doc.WriteString("version: v1\ntenants:\n")
	for i := range n {
		fmt.Fprintf(&doc, "  - {name: t%d}\n", i)
	}
	fmt.Fprintf(&doc, "layout:\n  - gpu: %q\n    instances:\n", sim.DefaultL4)
	for i := range n {
		fmt.Fprintf(&doc, "      - {profile: L4-1Q, tenant: t%d}\n", i)
	}
	return doc.String()
}

// The scenario the pre-flight exists for, scaled below the change bound:
// each of 500 tenants asks for a vGPU on the one L4, which has room for
// 16. It is refused at once, by Diff and by Execute, naming the GPU, the
// type and how many fit; no tenant is defined and no vGPU made.
func TestPreflightRefusesBeforeAnyChange(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const n = 500
	doc := tenantsOnL4(n)
	want := []string{
		"GPU 0000:81:00.0 (L4-24GB): L4-1Q×500 wanted, at most 16 fit",
		"500 vGPUs wanted need a VF each; 16 of its 16 VFs are free",
		"nothing was changed",
	}
	_, err := apply.Diff(ctx, e.m, parseDoc(t, doc))
	if !errors.Is(err, manager.ErrNoCapacity) {
		t.Fatalf("diff: error %v, want NoCapacity", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("diff: error %q lacks %q", err, w)
		}
	}
	// The same changes as a reviewed change set (JSON, or written by a
	// tool) reach Execute without Diff: it checks them again.
	var cs apply.ChangeSet
	for i := range n {
		name := fmt.Sprintf("t%d", i)
		cs.Changes = append(cs.Changes,
			apply.Change{Op: apply.OpDefineTenant, Tenant: name, Settings: &apply.TenantSettings{Quota: tenant.UnlimitedQuota(), Class: tenant.BestEffort}},
			apply.Change{Op: apply.OpCreate, GPU: sim.DefaultL4, Model: "L4-24GB", Profile: "L4-1Q", Kind: "vgpu", Tenant: name, VRAMBytes: 1 << 30})
	}
	executeRefused(t, e, cs, apply.Limits{}, manager.ErrNoCapacity, want...)
}

// At each limit the pre-flight checks, a document that fits exactly is
// carried out in full, and the same document with one instance more is
// refused before its first change.
func TestPreflightBoundary(t *testing.T) {
	heterogeneous := &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{
		{Model: "H100-SXM5-80GB", PCI: sim.DefaultH100TS, Flavour: gpu.FlavourVFIO, Heterogeneous: true},
	}}
	cases := []struct {
		name  string
		spec  *sim.Spec
		setup func(e *env)
		// fits is the document that fits exactly; extra the profiles
		// that one instance more adds to it.
		fits  string
		extra []string
		over  string // the extra instance as a document, for Diff
		kind  error
		want  string
	}{
		{name: "a vGPU type's maximum and the VFs",
			fits: layoutDoc(sim.DefaultL4, "", "L4-1Q×16"), extra: []string{"L4-1Q"}, over: layoutDoc(sim.DefaultL4, "", "L4-1Q×17"),
			kind: manager.ErrNoCapacity, want: "L4-1Q×17 wanted, at most 16 fit"},
		{name: "room the destroys free",
			setup: func(e *env) {
				e.tenant("old")
				e.create("old", "L4-8Q", sim.DefaultL4)
				e.create("old", "L4-8Q", sim.DefaultL4)
			},
			fits: layoutDoc(sim.DefaultL4, "", "L4-1Q×16"), extra: []string{"L4-1Q"}, over: layoutDoc(sim.DefaultL4, "", "L4-1Q×17"),
			kind: manager.ErrNoCapacity, want: "L4-1Q×17 wanted, at most 16 fit (the type's maximum per GPU is 16, 0 stay)"},
		{name: "a homogeneous GPU holds one type",
			fits: layoutDoc(sim.DefaultL4, "", "L4-4Q×6"), extra: []string{"L4-8Q"}, over: layoutDoc(sim.DefaultL4, "", "L4-4Q×6", "L4-8Q×1"),
			kind: manager.ErrNoCapacity, want: "in homogeneous vGPU mode (one type per GPU)"},
		{name: "a heterogeneous GPU's framebuffer", spec: heterogeneous,
			fits: layoutDoc(sim.DefaultH100TS, "", "H100XM-40C×2"), extra: []string{"H100XM-4C"}, over: layoutDoc(sim.DefaultH100TS, "", "H100XM-40C×2", "H100XM-4C×1"),
			kind: manager.ErrNoCapacity, want: "the GPU has 80GiB"},
		{name: "mdev parents",
			fits: layoutDoc(sim.DefaultA10, "", "A10-1Q×16"), extra: []string{"A10-1Q"}, over: layoutDoc(sim.DefaultA10, "", "A10-1Q×17"),
			kind: manager.ErrNoCapacity, want: "A10-1Q×17 wanted, at most 16 fit"},
		{name: "MIG slices",
			fits:  layoutDoc(sim.DefaultH100MIG, "", "3g.40gb×1", "2g.20gb×1", "1g.10gb×2"),
			extra: []string{"1g.10gb"}, over: layoutDoc(sim.DefaultH100MIG, "", "3g.40gb×1", "2g.20gb×1", "1g.10gb×3"),
			kind: manager.ErrNoCapacity, want: "they need 9 slices and 8 of its 8 are free"},
		{name: "MIG slices beside an instance that stays",
			setup: func(e *env) { e.tenant("acme"); e.create("acme", "3g.40gb", sim.DefaultH100MIG) },
			fits:  layoutDoc(sim.DefaultH100MIG, "", "3g.40gb×1", "2g.20gb×1", "1g.10gb×2"),
			extra: []string{"1g.10gb"}, over: layoutDoc(sim.DefaultH100MIG, "", "3g.40gb×1", "2g.20gb×1", "1g.10gb×3"),
			kind: manager.ErrNoCapacity, want: "they need 5 slices and 4 of its 8 are free"},
		{name: "a MIG profile's maximum",
			fits: layoutDoc(sim.DefaultH100MIG, "", "3g.40gb×2"), extra: []string{"3g.40gb"}, over: layoutDoc(sim.DefaultH100MIG, "", "3g.40gb×3"),
			kind: manager.ErrNoCapacity, want: "3g.40gb×3 wanted, at most 2 fit"},
		{name: "MIG slices the destroys free",
			setup: func(e *env) { e.tenant("old"); e.create("old", "7g.80gb", sim.DefaultH100MIG) },
			fits:  layoutDoc(sim.DefaultH100MIG, "", "1g.10gb×7"), extra: []string{"1g.10gb"}, over: layoutDoc(sim.DefaultH100MIG, "", "1g.10gb×8"),
			kind: manager.ErrNoCapacity, want: "1g.10gb×8 wanted, at most 7 fit"},
		{name: "passthrough takes the whole GPU",
			fits: layoutDoc(sim.DefaultL4, "", "passthrough×1"), extra: []string{"L4-1Q"}, over: layoutDoc(sim.DefaultL4, "", "passthrough×1", "L4-1Q×1"),
			kind: manager.ErrNoCapacity, want: "passthrough needs the GPU free of instances, but it would hold new L4-1Q×1"},
		{name: "a tenant's quota as the document sets it",
			fits:  layoutDoc(sim.DefaultL4, "    maxInstances: 2\n    vram: 8GiB\n", "L4-4Q×2"),
			extra: []string{"L4-4Q"}, over: layoutDoc(sim.DefaultL4, "    maxInstances: 2\n    vram: 8GiB\n", "L4-4Q×3"),
			kind: manager.ErrQuotaExceeded, want: "instance quota 2, used 0, request 3: 2 left"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnvSpec(t, c.spec)
			ctx := context.Background()
			if c.setup != nil {
				c.setup(e)
			}
			fits := parseDoc(t, c.fits)
			cs, err := apply.Diff(ctx, e.m, fits)
			if err != nil {
				t.Fatalf("diff of a document that fits: %v", err)
			}
			over := cs
			over.Changes = append([]apply.Change(nil), cs.Changes...)
			for _, p := range c.extra {
				over.Changes = append(over.Changes, another(t, cs, p))
			}
			executeRefused(t, e, over, apply.Limits{}, c.kind, c.want)
			if _, err := apply.Diff(ctx, e.m, parseDoc(t, c.over)); !errors.Is(err, c.kind) {
				t.Fatalf("diff of one instance too many: error %v, want %v", err, c.kind)
			}
			e.apply(fits)
		})
	}
}

// The number of changes one document may make is bounded: the report's
// document (3000 tenants, a vGPU each on one L4) is refused at once as
// too large, by Diff and by Execute, naming the count, the limit and how
// to raise it; the limit is the caller's to set.
func TestChangeBound(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const n = 3000
	doc := tenantsOnL4(n)
	want := []string{"6000 changes, more than the 1024", "applyMaxChanges"}
	_, err := apply.Diff(ctx, e.m, parseDoc(t, doc))
	if !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("diff: error %v, want InvalidArgument", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("diff: error %q lacks %q", err, w)
		}
	}
	var big apply.ChangeSet
	for i := range apply.DefaultMaxChanges + 1 {
		big.Changes = append(big.Changes, apply.Change{Op: apply.OpDefineTenant, Tenant: fmt.Sprintf("t%d", i),
			Settings: &apply.TenantSettings{Quota: tenant.UnlimitedQuota(), Class: tenant.BestEffort}})
	}
	executeRefused(t, e, big, apply.Limits{}, manager.ErrInvalidArgument, "1025 changes, more than the 1024")

	// A configured limit: four changes (a tenant, three vGPUs).
	d := parseDoc(t, layoutDoc(sim.DefaultL4, "", "L4-4Q×3"))
	if _, err := apply.DiffWith(ctx, e.m, d, apply.Limits{MaxChanges: 3}); !errors.Is(err, manager.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "4 changes, more than the 3") {
		t.Fatalf("diff within 3 changes: error %v, want InvalidArgument", err)
	}
	cs, err := apply.DiffWith(ctx, e.m, d, apply.Limits{MaxChanges: 4})
	if err != nil {
		t.Fatalf("diff within 4 changes: %v", err)
	}
	executeRefused(t, e, cs, apply.Limits{MaxChanges: 3}, manager.ErrInvalidArgument, "4 changes, more than the 3")
	if res, err := apply.ExecuteWith(ctx, e.m, cs, apply.Limits{MaxChanges: 4}); err != nil || len(res.Done) != 4 {
		t.Fatalf("execute within 4 changes: %+v, %v", res, err)
	}
}
