package manager

import (
	"context"
	"errors"
	"slices"

	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// TenantView is a tenant with what it uses now.
type TenantView struct {
	store.Tenant
	Usage tenant.Usage `json:"usage"`
}

// DefineTenant creates a tenant. Defining the same tenant again with the
// same settings is a no-op; with other settings it is ErrConflict (use
// SetQuota or UpdateTenant).
func (m *Manager) DefineTenant(ctx context.Context, t tenant.Tenant) (store.Tenant, error) {
	if t.Class == "" {
		t.Class = tenant.BestEffort
	}
	if err := t.Validate(); err != nil {
		return store.Tenant{}, classify(err, "define tenant %q", t.Name)
	}
	var out store.Tenant
	added := false
	err := m.db.Update(func(tx *store.Tx) error {
		prev, err := tx.Tenant(t.Name)
		if err == nil {
			if sameTenant(prev.Tenant, t) {
				out = prev
				return nil
			}
			return fail(ErrConflict, nil, "tenant %s exists with other settings; change it with `vgpuctl tenant set-quota %s`", t.Name, t.Name)
		}
		if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		t.Created = m.now()
		out = store.Tenant{Tenant: t}
		added = true
		return tx.PutTenant(&out)
	})
	if err != nil {
		return store.Tenant{}, classify(err, "define tenant %s", t.Name)
	}
	if added {
		m.log.Info("tenant defined", "tenant", t.Name, "quota", t.Quota.String(), "class", t.Class)
		m.emit(Event{Kind: EventTenantAdded, ID: t.Name})
	}
	return out, nil
}

func sameTenant(a, b tenant.Tenant) bool {
	return a.Quota == b.Quota && a.Class == b.Class && slices.Equal(a.AllowedModels, b.AllowedModels) && slices.Equal(a.AllowedProfiles, b.AllowedProfiles)
}

// UpdateTenant replaces a tenant's quota, class and allowed lists. A quota
// below current usage is accepted (existing instances stay) and only stops
// new admissions.
func (m *Manager) UpdateTenant(ctx context.Context, t tenant.Tenant) (store.Tenant, error) {
	if t.Class == "" {
		t.Class = tenant.BestEffort
	}
	if err := t.Validate(); err != nil {
		return store.Tenant{}, classify(err, "update tenant %q", t.Name)
	}
	m.admit.Lock()
	defer m.admit.Unlock()
	var out store.Tenant
	changed := false
	err := m.db.Update(func(tx *store.Tx) error {
		prev, err := tx.Tenant(t.Name)
		if err != nil {
			return err
		}
		if sameTenant(prev.Tenant, t) {
			out = prev
			return nil
		}
		t.Created = prev.Created
		prev.Tenant = t
		out, changed = prev, true
		return tx.PutTenant(&out)
	})
	if err != nil {
		return store.Tenant{}, classify(err, "update tenant %s", t.Name)
	}
	if changed {
		m.log.Info("tenant updated", "tenant", t.Name, "quota", t.Quota.String(), "class", t.Class)
		m.emit(Event{Kind: EventTenantChanged, ID: t.Name})
	}
	return out, nil
}

// SetQuota changes a tenant's quota only.
func (m *Manager) SetQuota(ctx context.Context, name string, q tenant.Quota) (store.Tenant, error) {
	cur, err := m.Tenant(name)
	if err != nil {
		return store.Tenant{}, err
	}
	t := cur.Tenant.Tenant
	t.Quota = q
	return m.UpdateTenant(ctx, t)
}

// UndefineTenant removes a tenant. One that still owns instances is
// refused (ErrBusy) unless force, which destroys (and detaches) its
// instances first. The removal is decided under the admission lock, so no
// instance is admitted for the tenant in between; a forced undefine that
// races with new creates destroys those too, a few times, then gives up
// with ErrBusy.
func (m *Manager) UndefineTenant(ctx context.Context, name string, force bool) error {
	done, err := m.begin()
	if err != nil {
		return err
	}
	defer done()
	destroyed := 0
	for attempt := 0; ; attempt++ {
		insts, err := m.Instances(name)
		if err != nil {
			return err
		}
		if len(insts) > 0 && !force {
			return fail(ErrBusy, nil, "tenant %s owns %d instances; destroy them first or undefine with --force", name, len(insts))
		}
		for _, in := range insts {
			if err := m.Destroy(ctx, in.UUID, DestroyOptions{Detach: true}); err != nil && !errors.Is(err, ErrNotFound) {
				return err
			}
			destroyed++
		}
		m.admit.Lock()
		err = m.db.Update(func(tx *store.Tx) error {
			if _, err := tx.Tenant(name); err != nil {
				return err
			}
			return tx.DeleteTenant(name)
		})
		m.admit.Unlock()
		if errors.Is(err, store.ErrInUse) && force && attempt < 3 {
			continue
		}
		if err != nil {
			return classify(err, "undefine tenant %s", name)
		}
		break
	}
	m.log.Info("tenant undefined", "tenant", name, "destroyed", destroyed)
	m.emit(Event{Kind: EventTenantRemoved, ID: name})
	return nil
}

// Tenant returns one tenant with its usage.
func (m *Manager) Tenant(name string) (TenantView, error) {
	all, err := m.Tenants()
	if err != nil {
		return TenantView{}, err
	}
	for _, t := range all {
		if t.Name == name {
			return t, nil
		}
	}
	return TenantView{}, fail(ErrNotFound, nil, "no tenant %s (run `vgpuctl tenant list`)", name)
}

// Tenants lists tenants with their usage.
func (m *Manager) Tenants() ([]TenantView, error) {
	var out []TenantView
	err := m.db.View(func(tx *store.Tx) error {
		ts, err := tx.Tenants()
		if err != nil {
			return err
		}
		recs, err := tx.Instances()
		if err != nil {
			return err
		}
		for _, t := range ts {
			v := TenantView{Tenant: t}
			for _, r := range recs {
				if r.Tenant == t.Name {
					v.Usage.VRAMBytes += r.VRAMBytes
					v.Usage.ComputeMilli += r.ComputeMilli
					v.Usage.Instances++
				}
			}
			out = append(out, v)
		}
		return nil
	})
	if err != nil {
		return nil, classify(err, "list tenants")
	}
	return out, nil
}
