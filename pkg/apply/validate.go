package apply

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// validate checks what does not depend on the host.
func (d *Desired) validate() error {
	if d.Prune && len(d.Tenants) == 0 {
		// prune undefines the tenants the file does not list: with none
		// listed that is every tenant, and a missing tenants key must not
		// wipe the host.
		return d.bad("prune", nil, "prune with no tenants listed would undefine every tenant; list the tenants to keep")
	}
	if err := d.validateTenants(); err != nil {
		return err
	}
	selectors := map[string]string{}
	for _, e := range d.Layout {
		if err := d.validateEntry(e, selectors); err != nil {
			return err
		}
	}
	return nil
}

// bad is a validation error at field of the file.
func (d *Desired) bad(field string, cause error, format string, args ...any) error {
	return &FileError{File: d.Source, Config: d.Config, Field: field, Msg: fmt.Sprintf(format, args...), Err: cause}
}

func (d *Desired) validateTenants() error {
	seen := map[string]int{}
	for i, s := range d.Tenants {
		f := fmt.Sprintf("tenants[%d]", i)
		if err := tenant.ValidateName(s.Name); err != nil {
			return d.bad(f+".name", err, "bad tenant name")
		}
		if j, dup := seen[s.Name]; dup {
			return d.bad(f+".name", nil, "tenant %s is already defined at tenants[%d]", s.Name, j)
		}
		seen[s.Name] = i
		if s.VRAM != "" {
			if _, err := tenant.ParseBytes(s.VRAM); err != nil {
				return d.bad(f+".vram", err, "bad VRAM quota")
			}
		}
		if s.Compute != "" {
			if _, err := tenant.ParseCompute(s.Compute); err != nil {
				return d.bad(f+".compute", err, "bad compute quota")
			}
		}
		if _, err := s.MaxInstances.Value(); err != nil {
			return d.bad(f+".maxInstances", err, "bad instance quota")
		}
		if s.Class != "" {
			if _, err := tenant.ParseClass(s.Class); err != nil {
				return d.bad(f+".class", err, "bad class")
			}
		}
		if _, err := s.Tenant(); err != nil {
			return d.bad(f, err, "bad tenant")
		}
	}
	return nil
}

// validateEntry checks one layout entry; selectors maps the GPUs each
// entry before it selects to that entry's source.
func (d *Desired) validateEntry(e LayoutEntry, selectors map[string]string) error {
	f := e.Source
	n := 0
	var key string
	if e.GPU != "" {
		n, key = n+1, "gpu "+strings.TrimSpace(e.GPU)
	}
	if e.Model != "" {
		n, key = n+1, "model "+e.Model
	}
	if e.All {
		n, key = n+1, "all"
	}
	if n != 1 {
		return d.bad(f, nil, "give exactly one of gpu (PCI address, UUID or index), model (a catalog model name) and all: true; got %d", n)
	}
	if strings.TrimSpace(e.GPU) != e.GPU {
		return d.bad(f+".gpu", nil, "%q has surrounding spaces", e.GPU)
	}
	switch e.IndexOrder {
	case "", IndexNVML:
	case IndexPCI:
		if _, err := strconv.Atoi(e.GPU); err != nil {
			return d.bad(f+".indexOrder", nil, "indexOrder %s counts GPUs by number; gpu %q is none", e.IndexOrder, e.GPU)
		}
		key += " in PCI order"
	default:
		return d.bad(f+".indexOrder", nil, "unknown index order %q (want nvml or pci)", e.IndexOrder)
	}
	// An empty list given is not "no list": a filter or scope that is
	// there but lists nothing would widen the entry to everything.
	if e.DeviceIDs != nil && len(e.DeviceIDs) == 0 {
		return d.bad(f+".deviceIDs", nil, "empty list; give PCI ids or leave deviceIDs out to match every GPU the entry selects")
	}
	if e.Scheduler != nil {
		if _, err := e.Scheduler.request(); err != nil {
			return d.bad(f+".scheduler", nil, "%v", err)
		}
		if e.MIG != nil && *e.MIG {
			return d.bad(f+".scheduler", nil, "a GPU with MIG on has no time-sliced vGPU scheduler")
		}
	}
	if e.Scope != nil && len(e.Scope) == 0 {
		return d.bad(f+".scope", nil, "empty list; give instance kinds (mig, mig-vgpu, vgpu, passthrough) or leave scope out to describe every kind")
	}
	if len(e.DeviceIDs) > 0 {
		// Filters narrow a selection: entries differing only in their
		// filters do not collide here (Diff refuses a GPU two select).
		key += " filtered by " + strings.Join(e.DeviceIDs, ",")
	}
	// Optional filtered entries may share a selector: NVIDIA's multi-model
	// configs list one device filter twice for two models that share a
	// PCI id, and each entry takes the GPUs that offer its profiles (Diff
	// still refuses a GPU that two entries select).
	if prev, dup := selectors[key]; dup && !(e.Optional && len(e.DeviceIDs) > 0) {
		return d.bad(f, nil, "selects the same GPUs (%s) as %s; merge the two entries", key, prev)
	}
	selectors[key] = f
	for j, id := range e.DeviceIDs {
		if _, err := parseDeviceID(id); err != nil {
			return d.bad(fmt.Sprintf("%s.deviceIDs[%d]", f, j), err, "bad PCI device id")
		}
	}
	for j, k := range e.Scope {
		switch k {
		case store.KindMIG, store.KindMIGVGPU, store.KindVGPU, store.KindPassthrough:
		default:
			return d.bad(fmt.Sprintf("%s.scope[%d]", f, j), nil, "unknown instance kind %q (want mig, mig-vgpu, vgpu or passthrough)", k)
		}
	}
	return d.validateInstances(e)
}

func (d *Desired) validateInstances(e LayoutEntry) error {
	wanted := map[[2]string]int{}
	for j, in := range e.Instances {
		fi := fmt.Sprintf("%s.instances[%d]", e.Source, j)
		if strings.TrimSpace(in.Profile) == "" {
			return d.bad(fi+".profile", nil, "no profile given (run `vgpuctl profiles` for the list)")
		}
		if strings.TrimSpace(in.Profile) != in.Profile {
			// As `vgpuctl create` refuses it: the name is not another profile.
			return d.bad(fi+".profile", nil, "%q has surrounding spaces", in.Profile)
		}
		if err := tenant.ValidateName(in.Tenant); err != nil {
			return d.bad(fi+".tenant", err, "bad tenant name")
		}
		if in.N() < 0 {
			return d.bad(fi+".count", nil, "%d is negative", in.N())
		}
		if in.N() > maxCount {
			return d.bad(fi+".count", nil, "%d is more instances than any GPU holds (at most %d)", in.N(), maxCount)
		}
		if in.Scheduler != nil {
			if _, err := in.Scheduler.request(); err != nil {
				return d.bad(fi+".scheduler", nil, "%v", err)
			}
		}
		k := [2]string{in.Profile, in.Tenant}
		if prev, dup := wanted[k]; dup {
			return d.bad(fi, nil, "profile %s for tenant %s is already asked for at instances[%d]; give one count", in.Profile, in.Tenant, prev)
		}
		wanted[k] = j
	}
	return nil
}

// maxCount bounds one count: no GPU holds more vGPUs or MIG instances, and
// the bound keeps a typo from planning millions of creates.
const maxCount = 64
