package apply

import (
	"errors"
	"strings"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// checkTenants: every create's tenant exists once the tenant changes are
// done, may use the profile, and its quota takes all of its creates beside
// the instances it keeps. Tenants the change set defines or updates count
// with the settings it gives them.
func checkTenants(h *host, cs ChangeSet, destroyed map[string]bool, creates []Change, pr *problems) {
	final := tenantsAfter(h, cs)
	used := usageStaying(h, destroyed)
	asked := map[string]tenant.Usage{}
	var names []string
	for _, c := range creates {
		t, ok := final[c.Tenant]
		if !ok {
			pr.add(manager.ErrNotFound, "%s: tenant %s is neither defined on the host nor by the change set", c, c.Tenant)
			continue
		}
		if t == nil {
			continue
		}
		vram, compute, model, profile := c.VRAMBytes, c.ComputeMilli, c.Model, c.Profile
		if g, ok := h.findGPU(gpuID(c)); ok {
			if info, _, ok := h.resolve(g.Model, c.Profile); ok {
				vram, compute, model, profile = info.VRAMBytes, info.ComputeMilli, g.Model, info.Name
			}
		}
		// The manager also accepts a profile under the name it was asked by.
		requested := c.Profile
		if c.Model != "" {
			requested = c.Model + "/" + c.Profile
		}
		if errors.Is(t.Admit(tenant.Usage{}, tenant.Request{Model: model, Profile: profile}), tenant.ErrNotAllowed) &&
			errors.Is(t.Admit(tenant.Usage{}, tenant.Request{Model: model, Profile: requested}), tenant.ErrNotAllowed) {
			pr.add(manager.ErrInvalidArgument, "%s: tenant %s may not use %s on %s (its allowed models or profiles)", c, c.Tenant, profile, model)
			continue
		}
		a, seen := asked[c.Tenant]
		if !seen {
			names = append(names, c.Tenant)
		}
		a.VRAMBytes += vram
		a.ComputeMilli += compute
		a.Instances++
		asked[c.Tenant] = a
	}
	for _, name := range names {
		checkQuota(name, final[name], used[name], asked[name], pr)
	}
}

// tenantsAfter is every tenant as it will be once the change set's tenant
// changes are done (undefined ones absent). A tenant the change set
// defines or updates without settings maps to nil.
func tenantsAfter(h *host, cs ChangeSet) map[string]*tenant.Tenant {
	final := map[string]*tenant.Tenant{}
	for name, v := range h.tenants {
		t := v.Tenant.Tenant
		final[name] = &t
	}
	for _, c := range cs.Changes {
		switch c.Op {
		case OpDefineTenant, OpUpdateTenant:
			if c.Settings == nil {
				// Refused by its own step; no quota is known to check.
				final[c.Tenant] = nil
				continue
			}
			t := c.Settings.tenant(c.Tenant)
			final[c.Tenant] = &t
		}
	}
	for _, c := range cs.Changes {
		if c.Op == OpUndefineTenant {
			delete(final, c.Tenant)
		}
	}
	return final
}

// usageStaying is what each tenant's instances that stay hold: those the
// change set destroys, or another caller is destroying, are left out.
func usageStaying(h *host, destroyed map[string]bool) map[string]tenant.Usage {
	used := map[string]tenant.Usage{}
	for _, in := range h.insts {
		if destroyed[in.UUID] || in.State == store.StateDestroying {
			continue
		}
		u := used[in.Tenant]
		u.VRAMBytes += in.VRAMBytes
		u.ComputeMilli += in.ComputeMilli
		u.Instances++
		used[in.Tenant] = u
	}
	return used
}

// checkQuota: t's quota takes what its creates ask for (a) beside what it
// keeps (u), on every resource at once.
func checkQuota(name string, t *tenant.Tenant, u, a tenant.Usage, pr *problems) {
	var over []tenant.Overage
	for _, o := range []tenant.Overage{
		{Resource: tenant.ResourceVRAM, Quota: t.Quota.VRAMBytes, Used: u.VRAMBytes, Request: a.VRAMBytes},
		{Resource: tenant.ResourceCompute, Quota: t.Quota.ComputeMilli, Used: u.ComputeMilli, Request: a.ComputeMilli},
		{Resource: tenant.ResourceInstances, Quota: t.Quota.MaxInstances, Used: u.Instances, Request: a.Instances},
	} {
		if o.Quota != tenant.Unlimited && (o.Used > o.Quota || o.Request > o.Quota-o.Used) {
			over = append(over, o)
		}
	}
	if len(over) > 0 {
		qe := &tenant.QuotaError{Tenant: name, Over: over}
		pr.add(manager.ErrQuotaExceeded, "the %d instances to create for tenant %s go over its quota: %s", a.Instances, name, strings.TrimPrefix(qe.Error(), "tenant "+name+": "))
	}
}
