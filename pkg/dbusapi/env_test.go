package dbusapi

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
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
	return newEnvOn(t, nil, busOpts, configure)
}

// newEnvOn is newEnv on the simulated host spec (nil: the default host).
func newEnvOn(t testing.TB, spec *sim.Spec, busOpts testbus.Options, configure func(*env, *Options)) *env {
	t.Helper()
	e := &env{t: t, log: &testenv.Buffer{}}
	e.bus = testbus.StartWith(t, busOpts)
	h := simhost.Start(t, simhost.Options{Spec: spec, Manager: manager.Config{BusyRetry: 1}})
	e.sim, e.m = h.Sim, h.Manager
	opts := Options{
		Address: e.bus.Address(), Version: "test-1",
		Logger:         slog.New(slog.NewTextHandler(e.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		ResyncInterval: time.Hour,
	}
	if configure != nil {
		configure(e, &opts)
	}
	var err error
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
