package dbusapi

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/discover"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/profiles"
)

// The default simulated host (pkg/gpu/sim).
const (
	h100MIG = "0000:41:00.0"
	h100TS  = "0000:61:00.0"
	l4      = "0000:81:00.0"
	a10     = "0000:a1:00.0"
)

// env is a private bus, a manager on the simulated host, the service on
// the bus and a client.
type env struct {
	t      testing.TB
	bus    *testbus.Bus
	sim    *sim.Host
	m      *manager.Manager
	svc    *Service
	client *Client
	log    *testenv.Buffer
}

// configure, when not nil, changes the service's options; it gets the env
// with its manager already made.
func newEnv(t testing.TB, busOpts testbus.Options, configure func(*env, *Options)) *env {
	t.Helper()
	e := &env{t: t, log: &testenv.Buffer{}}
	e.bus = testbus.StartWith(t, busOpts)
	dir := t.TempDir()
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	e.sim, err = sim.Open(filepath.Join(dir, "sim"), nil, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.sim.Close() })
	db, err := store.Open(filepath.Join(dir, "state.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	b := nvmlb.New(e.sim.NVML(), cat, nvmlb.Options{})
	if err := b.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	fs := sysfs.New(e.sim.FS())
	e.m = manager.New(cat, db, b, fs, discover.Host{NVML: b, Sysfs: fs}, nil, manager.Options{BusyRetry: 1})
	if _, err := e.m.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	opts := Options{
		Address: e.bus.Address(), Version: "test-1",
		Logger:         slog.New(slog.NewTextHandler(e.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		ResyncInterval: time.Hour,
	}
	if configure != nil {
		configure(e, &opts)
	}
	e.svc, err = Start(context.Background(), e.m, opts)
	if err != nil {
		t.Fatalf("start service: %v", err)
	}
	t.Cleanup(func() { e.svc.Close() })
	e.client = e.dial()
	return e
}

func (e *env) dial() *Client {
	e.t.Helper()
	c, err := Dial(context.Background(), e.bus.Address())
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func unlimitedQuota() Quota {
	return Quota{VRAMBytes: Unlimited, ComputeMilli: Unlimited, MaxInstances: Unlimited}
}

func (e *env) tenant(name string, q Quota) Tenant {
	e.t.Helper()
	t, err := e.client.DefineTenant(ctxT(e.t), TenantSpec{Name: name, Quota: q})
	if err != nil {
		e.t.Fatalf("define tenant %s: %v", name, err)
	}
	return t
}

func (e *env) create(tenantName, prof, gpu string) Instance {
	e.t.Helper()
	in, err := e.client.Create(ctxT(e.t), CreateRequest{Tenant: tenantName, Profile: prof, GPU: gpu})
	if err != nil {
		e.t.Fatalf("create %s: %v", prof, err)
	}
	return in
}
