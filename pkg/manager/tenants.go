package manager

import (
	"context"
	"errors"
	"slices"

	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// TenantView is a tenant with what it uses now.
type TenantView struct {
	store.Tenant
	Usage tenant.Usage `json:"usage"`
	// NotInCatalog lists the allowed models and profiles this host's
	// catalog does not have: kept (a tenant file may serve a whole
	// fleet), but they allow nothing here, and may be typos.
	NotInCatalog []string `json:"notInCatalog,omitempty"`
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
	if err := m.checkAllowed(t); err != nil {
		return store.Tenant{}, err
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

// checkAllowed refuses allow-list entries that cannot be model or profile
// names, and logs those this host's catalog does not have.
func (m *Manager) checkAllowed(t tenant.Tenant) error {
	for _, n := range t.AllowedModels {
		if !profile.IsModelName(n) {
			return fail(ErrInvalidArgument, nil, "tenant %s: allowed model %s is not a GPU model name like H100-SXM5-80GB (run `vgpuctl profiles`)", t.Name, QuoteArg(n))
		}
	}
	for _, n := range t.AllowedProfiles {
		if !profile.IsProfileName(n) {
			return fail(ErrInvalidArgument, nil, "tenant %s: allowed profile %s is not a MIG profile (3g.40gb), vGPU type (L4-4Q) or passthrough (run `vgpuctl profiles`)", t.Name, QuoteArg(n))
		}
	}
	if unknown := m.notInCatalog(t); len(unknown) > 0 {
		m.log.Warn("tenant allows models or profiles this host's catalog does not have; they allow nothing here", "tenant", t.Name, "names", unknown)
	}
	return nil
}

// notInCatalog lists t's allowed names the catalog does not have.
func (m *Manager) notInCatalog(t tenant.Tenant) []string {
	cat := m.catalog()
	var out []string
	for _, n := range t.AllowedModels {
		if !cat.HasModel(n) {
			out = append(out, "model "+n)
		}
	}
	for _, n := range t.AllowedProfiles {
		if !cat.HasProfile(n) {
			out = append(out, "profile "+n)
		}
	}
	return out
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
	if err := m.checkAllowed(t); err != nil {
		return store.Tenant{}, err
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
	if err := tenant.ValidateName(name); err != nil {
		return classify(err, "undefine tenant")
	}
	done, err := m.begin()
	if err != nil {
		return err
	}
	defer done()
	destroyed := 0
	for attempt := 0; ; attempt++ {
		// Only this tenant's instances, and only while the tenant exists:
		// an unknown name is NotFound before anything is destroyed.
		insts, err := m.TenantInstances(name)
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
		if errors.Is(err, store.ErrNotFound) {
			// Undefined by another caller meanwhile.
			return noTenant(name, err)
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
	if err := tenant.ValidateName(name); err != nil {
		return TenantView{}, classify(err, "tenant")
	}
	all, err := m.Tenants()
	if err != nil {
		return TenantView{}, err
	}
	for _, t := range all {
		if t.Name == name {
			return t, nil
		}
	}
	return TenantView{}, noTenant(name, nil)
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
			v := TenantView{Tenant: t, NotInCatalog: m.notInCatalog(t.Tenant)}
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
