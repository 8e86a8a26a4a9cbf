package apply

import (
	"context"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// Manager is what apply needs of *manager.Manager.
type Manager interface {
	GPUs() ([]manager.GPUView, error)
	Instances(tenant string) ([]manager.InstanceView, error)
	Tenants() ([]manager.TenantView, error)
	Profiles() []manager.ProfileInfo
	DefineTenant(ctx context.Context, t tenant.Tenant) (store.Tenant, error)
	UpdateTenant(ctx context.Context, t tenant.Tenant) (store.Tenant, error)
	UndefineTenant(ctx context.Context, name string, force bool) error
	SetMIGMode(ctx context.Context, id string, on bool) error
	Create(ctx context.Context, req manager.CreateRequest) (store.Instance, error)
	Destroy(ctx context.Context, id string, opts manager.DestroyOptions) error
}

// Op is what a change does.
type Op string

// Change is one step of a change set.
type Change struct {
	Op Op `json:"op"`
}

// String is the change on one line, for --dry-run.
func (c Change) String() string { return string(c.Op) }

// ChangeSet is what Diff found to do.
type ChangeSet struct {
	Changes  []Change `json:"changes"`
	Warnings []string `json:"warnings,omitempty"`
}

// Diff computes the minimal change set from the host to d.
func Diff(ctx context.Context, m Manager, d *Desired) (ChangeSet, error) {
	return ChangeSet{}, nil
}
