package apply

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// Diff computes the smallest change set that takes the host to d:
// instances are matched by (GPU, profile, tenant) and those that match are
// kept; on every GPU the layout covers, instances it does not ask for (in
// the entry's scope) are destroyed and missing ones created pinned to that
// GPU. GPUs the layout does not cover are left alone, as are tenants the
// file does not list unless d.Prune. Nothing on the host changes.
//
// A layout the host cannot take is refused before anything is done: a GPU
// or profile the host lacks, a tenant neither in the file nor on the host,
// a quota or allowed list the creates would break, an attached instance to
// destroy, a pruned tenant left owning instances. Errors are *FileError
// wrapping the manager's sentinel for the cause. A change set with more
// changes than the limit (DefaultMaxChanges; DiffWith takes another), or
// whose creates the GPUs cannot hold beside what stays (see preflight), is
// refused with a *PreflightError; Execute checks both again before its
// first change.
func Diff(ctx context.Context, m Manager, d *Desired) (ChangeSet, error) {
	return DiffWith(ctx, m, d, Limits{})
}

// DiffWith is Diff within lim.
func DiffWith(ctx context.Context, m Manager, d *Desired, lim Limits) (ChangeSet, error) {
	if d == nil {
		return ChangeSet{}, fmt.Errorf("%w: no desired layout", manager.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return ChangeSet{}, err
	}
	h, err := readHost(m)
	if err != nil {
		return ChangeSet{}, fmt.Errorf("read the host: %w", err)
	}
	df := &differ{d: d, h: h, cs: ChangeSet{Source: d.Source, Config: d.Config}}
	df.warn = func(format string, args ...any) {
		df.cs.Warnings = append(df.cs.Warnings, fmt.Sprintf(format, args...))
	}
	final, err := df.tenants()
	if err != nil {
		return ChangeSet{}, err
	}
	cover, err := df.coverage()
	if err != nil {
		return ChangeSet{}, err
	}
	destroyed := map[string]bool{}
	for _, g := range h.gpus {
		c, ok := cover[g.UUID]
		if !ok {
			continue
		}
		if err := df.gpu(g, c.e, destroyed); err != nil {
			return ChangeSet{}, err
		}
	}
	if err := checkSize(df.cs, lim); err != nil {
		return ChangeSet{}, err
	}
	if err := df.check(final, destroyed); err != nil {
		return ChangeSet{}, err
	}
	if err := preflight(h, df.cs); err != nil {
		return ChangeSet{}, err
	}
	for i, c := range df.cs.Changes {
		if c.Op == OpSetMIGMode {
			df.cs.Changes[i].ResetSteps = h.resetSteps[c.GPUUUID]
		}
	}
	sortChanges(df.cs.Changes)
	sort.Strings(df.cs.Kept)
	return df.cs, nil
}

// differ carries one Diff.
type differ struct {
	d    *Desired
	h    *host
	cs   ChangeSet
	warn func(format string, args ...any)
}

func (df *differ) fail(kind error, field string, cause error, format string, args ...any) error {
	return &FileError{File: df.d.Source, Config: df.d.Config, Field: field, Msg: fmt.Sprintf(format, args...), Kind: kind, Err: cause}
}

// tenants adds the tenant changes and returns every tenant as it will be
// once they are done (pruned ones absent).
func (df *differ) tenants() (map[string]tenant.Tenant, error) {
	final := map[string]tenant.Tenant{}
	for name, v := range df.h.tenants {
		final[name] = v.Tenant.Tenant
	}
	inFile := map[string]bool{}
	for i, s := range df.d.Tenants {
		inFile[s.Name] = true
		t, err := s.Tenant()
		if err != nil {
			return nil, df.fail(manager.ErrInvalidArgument, fmt.Sprintf("tenants[%d]", i), err, "bad tenant")
		}
		want := settingsOf(t)
		cur, exists := df.h.tenants[s.Name]
		switch {
		case !exists:
			df.cs.Changes = append(df.cs.Changes, Change{Op: OpDefineTenant, Tenant: s.Name, Settings: want})
			final[s.Name] = t
		case s.Ensure:
			// Defined already: an ensured tenant keeps what the host has.
		default:
			have := settingsOf(cur.Tenant.Tenant)
			if have.Class == "" {
				have.Class = tenant.BestEffort
			}
			if !sameSettings(have, want) {
				df.cs.Changes = append(df.cs.Changes, Change{Op: OpUpdateTenant, Tenant: s.Name, Settings: want, Reason: "was " + have.String()})
				final[s.Name] = t
			}
		}
	}
	if df.d.Prune {
		for name := range df.h.tenants {
			if !inFile[name] {
				df.cs.Changes = append(df.cs.Changes, Change{Op: OpUndefineTenant, Tenant: name, Reason: "not in the file (prune)"})
				delete(final, name)
			}
		}
	}
	return final, nil
}

type coverage struct {
	e   *LayoutEntry
	idx int
}

// precedence of selectors: one GPU, one model, all.
func rank(e *LayoutEntry) int {
	switch {
	case e.GPU != "":
		return 0
	case e.Model != "":
		return 1
	}
	return 2
}

// coverage decides which entry describes each GPU. An optional entry
// (NVIDIA's formats) that selects no GPU is skipped and listed in the
// change set; when every entry is skipped, the file does not apply to
// this host at all, which is an error.
func (df *differ) coverage() (map[string]coverage, error) {
	cover := map[string]coverage{}
	skipped := 0
	for i := range df.d.Layout {
		e := &df.d.Layout[i]
		var cands []manager.GPUView
		switch {
		case e.GPU != "":
			g, ok := df.h.entryGPU(e)
			if !ok && e.Optional {
				skipped++
				df.skip("%s: no GPU %s on this host%s", e.Source, e.GPU, orderNote(e))
				continue
			}
			if !ok {
				return nil, df.fail(manager.ErrNotFound, e.Source+".gpu", nil, "no GPU %q on this host (run `vgpuctl gpus`)", e.GPU)
			}
			cands = []manager.GPUView{g}
		case e.Model != "":
			for _, g := range df.h.gpus {
				if g.Model == e.Model {
					cands = append(cands, g)
				}
			}
		default:
			cands = df.h.gpus
		}
		fit, filtered := 0, 0
		for _, g := range cands {
			if !matchesFilter(g, e.DeviceIDs) {
				continue
			}
			filtered++
			if e.GPU == "" {
				ok, err := df.fits(g, e)
				if err != nil {
					return nil, err
				}
				if !ok {
					continue
				}
			}
			fit++
			prev, taken := cover[g.UUID]
			switch {
			case !taken || rank(e) < rank(prev.e):
				cover[g.UUID] = coverage{e: e, idx: i}
			case rank(e) == rank(prev.e):
				return nil, df.fail(manager.ErrInvalidArgument, e.Source, nil, "selects GPU %s, which %s selects too; give each GPU one entry", g.PCI, prev.e.Source)
			}
		}
		switch {
		case fit > 0:
		case e.Optional:
			skipped++
			df.skipUnfit(e, filtered)
		case e.All && len(e.Instances) > 0:
			return nil, df.fail(manager.ErrInvalidArgument, e.Source, nil, "no GPU of this host can take %s%s", instanceList(e.Instances), filterNote(e))
		case e.Model != "":
			df.warn("%s: no GPU of model %s%s on this host; nothing to do for it", e.Source, e.Model, filterNote(e))
		case e.GPU != "":
			df.warn("%s: GPU %s does not match the device filter %s; left alone", e.Source, e.GPU, strings.Join(e.DeviceIDs, ","))
		}
	}
	if skipped > 0 && skipped == len(df.d.Layout) {
		return nil, df.fail(manager.ErrInvalidArgument, "", nil, "nothing in it applies to this host: %s", strings.Join(df.cs.Skipped, "; "))
	}
	return cover, nil
}

func (df *differ) skip(format string, args ...any) {
	df.cs.Skipped = append(df.cs.Skipped, fmt.Sprintf(format, args...))
}

// skipUnfit says why an optional entry covers no GPU: none passed its
// device filter, or those that did cannot take it.
func (df *differ) skipUnfit(e *LayoutEntry, filtered int) {
	switch {
	case e.GPU != "":
		df.skip("%s: GPU %s%s does not match the device filter %s", e.Source, e.GPU, orderNote(e), strings.Join(e.DeviceIDs, ","))
	case filtered == 0 && len(e.DeviceIDs) > 0:
		df.skip("%s: no GPU of this host matches the device filter %s", e.Source, strings.Join(e.DeviceIDs, ","))
	case len(e.Instances) > 0:
		df.skip("%s: no GPU of this host%s can take %s", e.Source, filterNote(e), instanceList(e.Instances))
	default:
		df.skip("%s: no MIG-capable GPU on this host%s", e.Source, filterNote(e))
	}
}

func orderNote(e *LayoutEntry) string {
	if e.IndexOrder == IndexPCI {
		return " (counted in PCI address order)"
	}
	return ""
}

// nvidiaVendor is NVIDIA's PCI vendor id.
const nvidiaVendor = 0x10DE

func matchesFilter(g manager.GPUView, ids []string) bool {
	if len(ids) == 0 {
		return true
	}
	id := uint32(g.PCIDeviceID)<<16 | nvidiaVendor
	for _, s := range ids {
		if v, err := parseDeviceID(s); err == nil && v == id {
			return true
		}
	}
	return false
}

// fits says whether a model or all entry describes g: an entry that sets
// a MIG mode describes MIG-capable GPUs, and one listing profiles the GPUs
// that offer them. A GPU offering some of the profiles and not others is a
// mistake in the file, not a GPU to skip.
func (df *differ) fits(g manager.GPUView, e *LayoutEntry) (bool, error) {
	if e.MIG != nil && !g.MIG.Capable {
		return false, nil
	}
	if len(e.Instances) == 0 {
		return true, nil
	}
	var have, lack []string
	for _, in := range e.Instances {
		if _, _, ok := df.h.resolve(g.Model, in.Profile); ok {
			have = append(have, in.Profile)
		} else {
			lack = append(lack, in.Profile)
		}
	}
	if len(have) > 0 && len(lack) > 0 {
		return false, df.fail(manager.ErrInvalidArgument, e.Source, nil, "GPU %s (%s) offers %s but not %s; give its model an entry of its own",
			g.PCI, g.Model, strings.Join(have, ", "), strings.Join(lack, ", "))
	}
	return len(lack) == 0, nil
}

func filterNote(e *LayoutEntry) string {
	if len(e.DeviceIDs) == 0 {
		return ""
	}
	return " matching " + strings.Join(e.DeviceIDs, ",")
}

func instanceList(ins []InstanceSpec) string {
	var parts []string
	for _, in := range ins {
		parts = append(parts, fmt.Sprintf("%d×%s", in.N(), in.Profile))
	}
	return strings.Join(parts, ", ")
}
