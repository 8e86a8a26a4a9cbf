package manager_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// env is a manager on a simulated host (simhost); cat, sim, db and m
// are the host's pieces, db and m those of the latest start.
type env struct {
	t     testing.TB
	host  *simhost.Host
	cat   *profile.Catalog
	sim   *sim.Host
	db    *store.DB
	m     *manager.Manager
	crash func(string)
}

func newEnv(t testing.TB, spec *sim.Spec) *env {
	t.Helper()
	e := &env{t: t}
	e.host = simhost.Start(t, simhost.Options{
		Spec: spec,
		Manager: manager.Config{
			Crash:     func(p string) { e.crashAt(p) },
			BusyRetry: 1,
			Logger:    testenv.Logger(t),
		},
		SimBootID: true,
	})
	e.cat, e.sim, e.db, e.m = e.host.Catalog, e.host.Sim, e.host.DB, e.host.Manager
	return e
}

func (e *env) crashAt(p string) {
	if e.crash != nil {
		e.crash(p)
	}
}

// restart simulates the daemon dying and starting again on the same state.
func (e *env) restart() manager.ReconcileReport {
	e.t.Helper()
	e.crash = nil
	if err := e.host.Restart(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.db, e.m = e.host.DB, e.host.Manager
	return e.host.Report
}

func (e *env) tenant(name string, q tenant.Quota) {
	e.t.Helper()
	if _, err := e.m.DefineTenant(context.Background(), tenant.Tenant{Name: name, Quota: q}); err != nil {
		e.t.Fatal(err)
	}
}

func unlimited() tenant.Quota {
	return tenant.Quota{VRAMBytes: tenant.Unlimited, ComputeMilli: tenant.Unlimited, MaxInstances: tenant.Unlimited}
}

func (e *env) create(tn, profile, gpu string) (store.Instance, error) {
	return e.m.Create(context.Background(), manager.CreateRequest{Tenant: tn, Profile: profile, GPU: gpu})
}

func (e *env) mustCreate(tn, profile, gpu string) store.Instance {
	e.t.Helper()
	r, err := e.create(tn, profile, gpu)
	if err != nil {
		e.t.Fatalf("create %s: %v", profile, err)
	}
	return r
}

// discovered is the host as discovery (NVML + sysfs) sees it, as JSON.
func (e *env) discovered() string {
	e.t.Helper()
	if err := e.m.Refresh(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	b, err := json.Marshal(e.m.Inventory())
	if err != nil {
		e.t.Fatal(err)
	}
	return string(b)
}

// waitIntents waits until n intents are left (background undos finish
// once the host answers).
func (e *env) waitIntents(n int) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var its []store.Intent
		if err := e.db.View(func(tx *store.Tx) (err error) { its, err = tx.Intents(); return err }); err != nil {
			e.t.Fatal(err)
		}
		if len(its) == n {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%d intents left, want %d: %+v", len(its), n, its)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) summary() string {
	e.t.Helper()
	s, err := e.sim.Summary()
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// assertConsistent checks that every record is on the host and every
// device on the host has a record.
func assertConsistent(t *testing.T, e *env) {
	t.Helper()
	rep, err := e.m.Reconcile(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Foreign) != 0 || len(rep.Recreated) != 0 || len(rep.Failed) != 0 || len(rep.Finished)+len(rep.Undone) != 0 {
		t.Fatalf("second reconcile not clean: %+v\n%s", rep, e.summary())
	}
	insts, _ := e.m.AllInstances()
	for _, in := range insts {
		if in.State != store.StateReady {
			t.Fatalf("instance %s is %s", in.UUID, in.State)
		}
	}
}
