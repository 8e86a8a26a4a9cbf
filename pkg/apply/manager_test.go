package apply_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

var _ apply.Manager = (*manager.Manager)(nil)

// env is a manager on the default simulated host, built as a daemon
// builds it: sim below the NVML and sysfs backends, a store, reconcile.
type env struct {
	t   *testing.T
	sim *sim.Host
	m   *manager.Manager
	db  *store.DB
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvSpec(t, nil)
}

// newEnvSpec is newEnv on another simulated host (nil: the default).
func newEnvSpec(t *testing.T, spec *sim.Spec) *env {
	t.Helper()
	return newEnvConfig(t, spec, manager.Config{BusyRetry: 1})
}

// newEnvConfig is newEnvSpec with the manager configured as c says.
func newEnvConfig(t *testing.T, spec *sim.Spec, c manager.Config) *env {
	t.Helper()
	h := simhost.Start(t, simhost.Options{Spec: spec, Manager: c})
	return &env{t: t, sim: h.Sim, m: h.Manager, db: h.DB}
}

func (e *env) tenant(name string) {
	e.t.Helper()
	if _, err := e.m.DefineTenant(context.Background(), tenant.Tenant{Name: name, Quota: tenant.UnlimitedQuota()}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) create(tn, profile, gpu string) store.Instance {
	e.t.Helper()
	r, err := e.m.Create(context.Background(), manager.CreateRequest{Tenant: tn, Profile: profile, GPU: gpu})
	if err != nil {
		e.t.Fatalf("create %s on %s: %v", profile, gpu, err)
	}
	return r
}

func (e *env) summary() string {
	e.t.Helper()
	s, err := e.sim.Summary()
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// layout is the host's instances as "GPU tenant profile×n" lines, sorted.
func (e *env) layout() []string {
	e.t.Helper()
	insts, err := e.m.AllInstances()
	if err != nil {
		e.t.Fatal(err)
	}
	n := map[string]int{}
	for _, in := range insts {
		if in.State != store.StateReady {
			e.t.Fatalf("instance %s is %s", in.UUID, in.State)
		}
		p := in.Profile
		if i := strings.Index(p, "/"); i >= 0 {
			p = p[i+1:]
		}
		n[fmt.Sprintf("%s %s %s", in.GPUPCI, in.Tenant, p)]++
	}
	var out []string
	for k, v := range n {
		out = append(out, fmt.Sprintf("%s×%d", k, v))
	}
	sort.Strings(out)
	return out
}

func (e *env) uuids() map[string]bool {
	e.t.Helper()
	insts, err := e.m.AllInstances()
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]bool{}
	for _, in := range insts {
		out[in.UUID] = true
	}
	return out
}

func (e *env) migOn(pci string) bool {
	e.t.Helper()
	g, err := e.m.GPU(pci)
	if err != nil {
		e.t.Fatal(err)
	}
	return g.MIG.Enabled
}

// apply parses, diffs and executes, then checks a second diff is empty.
func (e *env) apply(d *apply.Desired) (apply.ChangeSet, apply.Result) {
	e.t.Helper()
	ctx := context.Background()
	cs, err := apply.Diff(ctx, e.m, d)
	if err != nil {
		e.t.Fatalf("diff: %v", err)
	}
	res, err := apply.Execute(ctx, e.m, cs)
	if err != nil {
		e.t.Fatalf("execute: %v\nchanges:\n%s", err, cs)
	}
	if len(res.Done) != len(cs.Changes) {
		e.t.Fatalf("done %d of %d", len(res.Done), len(cs.Changes))
	}
	again, err := apply.Diff(ctx, e.m, d)
	if err != nil {
		e.t.Fatalf("second diff: %v", err)
	}
	if !again.Empty() {
		e.t.Fatalf("second diff not empty:\n%s", again)
	}
	return cs, res
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustParse(t *testing.T, file, config string) *apply.Desired {
	t.Helper()
	d, err := apply.Parse(file, readFile(t, file), config)
	if err != nil {
		t.Fatalf("parse %s %s: %v", file, config, err)
	}
	return d
}

func lines(cs apply.ChangeSet) []string {
	var out []string
	for _, c := range cs.Changes {
		out = append(out, c.String())
	}
	return out
}

func readFileF(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join("testdata", name))
}
