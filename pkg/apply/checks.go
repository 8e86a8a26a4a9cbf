package apply

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// check refuses change sets that would fail half-way: creates for tenants
// that will not exist or that their quota or allowed lists refuse,
// destroys of attached instances, pruned tenants left owning instances.
func (df *differ) check(final map[string]tenant.Tenant, destroyed map[string]bool) error {
	if err := df.checkAttached(destroyed); err != nil {
		return err
	}
	if err := df.checkPruned(destroyed); err != nil {
		return err
	}
	return df.checkCreates(final, destroyed)
}

// checkAttached refuses to destroy instances attached to VMs.
func (df *differ) checkAttached(destroyed map[string]bool) error {
	var attached []string
	for _, in := range df.h.insts {
		if destroyed[in.UUID] && in.Attachment != nil {
			attached = append(attached, fmt.Sprintf("%s (%s on %s, VM %s)", in.UUID, df.h.profileOf(in.Instance), in.GPUPCI, in.Attachment.Domain))
		}
	}
	if len(attached) > 0 {
		return df.fail(manager.ErrBusy, "layout", nil, "the layout would destroy instances attached to VMs: %s; detach them first (`vgpuctl detach`) or keep them in the layout",
			strings.Join(attached, ", "))
	}
	return nil
}

// checkPruned refuses to undefine a tenant that keeps instances.
func (df *differ) checkPruned(destroyed map[string]bool) error {
	for _, c := range df.cs.Changes {
		if c.Op != OpUndefineTenant {
			continue
		}
		var left []string
		for _, in := range df.h.insts {
			if in.Tenant == c.Tenant && !destroyed[in.UUID] {
				left = append(left, fmt.Sprintf("%s on %s", in.UUID, in.GPUPCI))
			}
		}
		if len(left) > 0 {
			return df.fail(manager.ErrBusy, "prune", nil, "tenant %s is not in the file, but owns instances on GPUs the layout does not describe (%s); destroy them or keep the tenant in the file",
				c.Tenant, strings.Join(left, ", "))
		}
	}
	return nil
}

// checkCreates admits each create, in Execute's order, for its tenant as
// it will be (final), beside the instances that stay and the creates
// before it.
func (df *differ) checkCreates(final map[string]tenant.Tenant, destroyed map[string]bool) error {
	usage := map[string]tenant.Usage{}
	for _, in := range df.h.insts {
		if destroyed[in.UUID] {
			continue
		}
		u := usage[in.Tenant]
		u.VRAMBytes += in.VRAMBytes
		u.ComputeMilli += in.ComputeMilli
		u.Instances++
		usage[in.Tenant] = u
	}
	creates := slices.Clone(df.cs.Changes)
	sortChanges(creates)
	for _, c := range creates {
		if c.Op != OpCreate {
			continue
		}
		t, ok := final[c.Tenant]
		if !ok {
			why := "is neither in the file nor defined on the host"
			if _, onHost := df.h.tenants[c.Tenant]; onHost {
				why = "is pruned (not in the file)"
			}
			return df.fail(manager.ErrNotFound, c.Source, nil, "tenant %s %s; add it to tenants", c.Tenant, why)
		}
		u := usage[c.Tenant]
		err := t.Admit(u, tenant.Request{VRAMBytes: c.VRAMBytes, ComputeMilli: c.ComputeMilli, Model: c.Model, Profile: c.Profile})
		switch {
		case errors.Is(err, tenant.ErrQuotaExceeded):
			return df.fail(manager.ErrQuotaExceeded, c.Source, err, "creating %s on %s for tenant %s goes over its quota", c.Profile, c.GPU, c.Tenant)
		case errors.Is(err, tenant.ErrNotAllowed):
			return df.fail(manager.ErrInvalidArgument, c.Source, err, "tenant %s may not use %s on %s", c.Tenant, c.Profile, c.GPU)
		case err != nil:
			return df.fail(manager.ErrInvalidArgument, c.Source, err, "tenant %s", c.Tenant)
		}
		u.VRAMBytes += c.VRAMBytes
		u.ComputeMilli += c.ComputeMilli
		u.Instances++
		usage[c.Tenant] = u
	}
	return nil
}
