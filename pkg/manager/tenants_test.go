package manager_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/tenant"
)

func TestTenantLifecycle(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.tenant("acme", unlimited())
	if _, err := e.m.DefineTenant(ctx, tenant.Tenant{Name: "acme", Quota: unlimited()}); err != nil {
		t.Fatalf("identical redefine: %v", err)
	}
	if _, err := e.m.DefineTenant(ctx, tenant.Tenant{Name: "acme"}); !errors.Is(err, manager.ErrConflict) {
		t.Fatalf("conflicting redefine: %v", err)
	}
	r := e.mustCreate("acme", "L4-4Q", "")
	if err := e.m.UndefineTenant(ctx, "acme", false); !errors.Is(err, manager.ErrBusy) {
		t.Fatalf("undefine with instances: %v", err)
	}
	if _, err := e.m.SetQuota(ctx, "acme", tenant.Quota{VRAMBytes: 1 << 30, ComputeMilli: 100, MaxInstances: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.create("acme", "L4-4Q", ""); !errors.Is(err, manager.ErrQuotaExceeded) {
		t.Fatalf("after lowering quota: %v", err)
	}
	if err := e.m.UndefineTenant(ctx, "acme", true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Instance(r.UUID); !errors.Is(err, manager.ErrNotFound) {
		t.Fatalf("forced undefine left the instance: %v", err)
	}
	if strings.Contains(e.summary(), " vf0") {
		t.Fatalf("forced undefine left the device:\n%s", e.summary())
	}
}
