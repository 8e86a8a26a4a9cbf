package apply

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// Manager is what apply needs of *manager.Manager: reads of the host and
// the operations a change set is made of. Errors carry the manager's
// sentinels (manager.ErrNotFound, ErrBusy, ...), which Execute keeps.
type Manager interface {
	GPUs() ([]manager.GPUView, error)
	// AllInstances lists every instance of the host.
	AllInstances() ([]manager.InstanceView, error)
	Tenants() ([]manager.TenantView, error)
	// Profiles lists the profiles of the models present on the host.
	Profiles() []manager.ProfileInfo
	DefineTenant(ctx context.Context, t tenant.Tenant) (store.Tenant, error)
	UpdateTenant(ctx context.Context, t tenant.Tenant) (store.Tenant, error)
	UndefineTenant(ctx context.Context, name string, force bool) error
	SetMIGMode(ctx context.Context, id string, on bool) error
	Create(ctx context.Context, req manager.CreateRequest) (store.Instance, error)
	// Destroy of an unknown instance is manager.ErrNotFound.
	Destroy(ctx context.Context, id string, opts manager.DestroyOptions) error
}

// Op is what a change does.
type Op string

// The operations, in the order Execute performs them.
const (
	OpDestroy        Op = "destroy"
	OpSetMIGMode     Op = "set-mig-mode"
	OpDefineTenant   Op = "define-tenant"
	OpUpdateTenant   Op = "update-tenant"
	OpUndefineTenant Op = "undefine-tenant"
	OpCreate         Op = "create"
)

// phase orders the operations: destroys free room and let MIG modes
// change; the mode must be right before anything is carved; tenants must
// exist (and have their new quotas) before their instances are created.
func (o Op) phase() int {
	switch o {
	case OpDestroy:
		return 0
	case OpSetMIGMode:
		return 1
	case OpDefineTenant, OpUpdateTenant:
		return 2
	case OpUndefineTenant:
		return 3
	case OpCreate:
		return 4
	}
	return 5
}

// Change is one step of a change set. It carries everything Execute needs,
// so a change set survives a JSON round trip (dry run, review, execute).
type Change struct {
	Op Op `json:"op"`
	// GPU is the GPU's PCI address, GPUUUID its UUID (what Execute uses).
	GPU     string `json:"gpu,omitempty"`
	GPUUUID string `json:"gpuUUID,omitempty"`
	Model   string `json:"model,omitempty"`
	// Instance is the destroyed instance; in a Result, also the created one.
	Instance string `json:"instance,omitempty"`
	// Profile is the profile's canonical name on Model ("3g.40gb", "L4-4Q").
	Profile string `json:"profile,omitempty"`
	Kind    string `json:"kind,omitempty"`
	Tenant  string `json:"tenant,omitempty"`
	// MIG is the mode set-mig-mode sets.
	MIG *bool `json:"mig,omitempty"`
	// Settings are what define-tenant and update-tenant set.
	Settings *TenantSettings `json:"settings,omitempty"`
	// VRAMBytes and ComputeMilli size a create; the largest go first.
	VRAMBytes    uint64 `json:"vramBytes,omitempty"`
	ComputeMilli uint64 `json:"computeMilli,omitempty"`
	// Reason says why the change is needed.
	Reason string `json:"reason,omitempty"`
	// Source is the layout entry asking for it.
	Source string `json:"source,omitempty"`
}

// TenantSettings are a tenant's quota, class and allowed lists.
type TenantSettings struct {
	Quota           tenant.Quota `json:"quota"`
	Class           tenant.Class `json:"class"`
	AllowedModels   []string     `json:"allowedModels,omitempty"`
	AllowedProfiles []string     `json:"allowedProfiles,omitempty"`
}

func settingsOf(t tenant.Tenant) *TenantSettings {
	return &TenantSettings{Quota: t.Quota, Class: t.Class, AllowedModels: t.AllowedModels, AllowedProfiles: t.AllowedProfiles}
}

func (s *TenantSettings) tenant(name string) tenant.Tenant {
	return tenant.Tenant{Name: name, Quota: s.Quota, Class: s.Class, AllowedModels: s.AllowedModels, AllowedProfiles: s.AllowedProfiles}
}

func (s *TenantSettings) String() string {
	if s == nil {
		return ""
	}
	out := s.Quota.String() + " class=" + string(s.Class)
	if len(s.AllowedModels) > 0 {
		out += " models=" + strings.Join(s.AllowedModels, ",")
	}
	if len(s.AllowedProfiles) > 0 {
		out += " profiles=" + strings.Join(s.AllowedProfiles, ",")
	}
	return out
}

func sameSettings(a, b *TenantSettings) bool {
	return a.Quota == b.Quota && a.Class == b.Class && slices.Equal(a.AllowedModels, b.AllowedModels) && slices.Equal(a.AllowedProfiles, b.AllowedProfiles)
}

// String is the change on one line, as --dry-run prints it.
func (c Change) String() string {
	var s string
	switch c.Op {
	case OpDestroy:
		s = fmt.Sprintf("destroy %s %s of tenant %s on %s", c.Profile, c.Instance, c.Tenant, c.GPU)
	case OpSetMIGMode:
		verb := "disable"
		if c.MIG != nil && *c.MIG {
			verb = "enable"
		}
		s = fmt.Sprintf("%s MIG on %s (%s)", verb, c.GPU, c.Model)
	case OpDefineTenant:
		s = fmt.Sprintf("define tenant %s: %s", c.Tenant, c.Settings)
	case OpUpdateTenant:
		s = fmt.Sprintf("update tenant %s: %s", c.Tenant, c.Settings)
	case OpUndefineTenant:
		s = fmt.Sprintf("undefine tenant %s", c.Tenant)
	case OpCreate:
		s = fmt.Sprintf("create %s for tenant %s on %s (%s)", c.Profile, c.Tenant, c.GPU, c.Model)
	default:
		s = string(c.Op)
	}
	if c.Reason != "" {
		s += ": " + c.Reason
	}
	return s
}

// ChangeSet is what Diff found to do, in the order Execute does it.
type ChangeSet struct {
	Source  string   `json:"source,omitempty"`
	Config  string   `json:"config,omitempty"`
	Changes []Change `json:"changes"`
	// Kept are the instances that already fit the layout, left untouched.
	Kept []string `json:"kept,omitempty"`
	// Warnings are what the operator should know and nothing will change:
	// entries that cover no GPU, lost GPUs, devices vgpud did not create.
	Warnings []string `json:"warnings,omitempty"`
}

// Empty reports whether the host already is as described.
func (cs ChangeSet) Empty() bool { return len(cs.Changes) == 0 }

// String lists the changes one per line, then the warnings.
func (cs ChangeSet) String() string {
	var b strings.Builder
	for _, c := range cs.Changes {
		b.WriteString(c.String() + "\n")
	}
	for _, w := range cs.Warnings {
		b.WriteString("warning: " + w + "\n")
	}
	return b.String()
}

// sortChanges puts changes in Execute's order: by phase; destroys and
// mode changes by GPU; tenants by name; creates largest first (VRAM, then
// compute), so small instances do not fragment the room big ones need.
func sortChanges(cs []Change) {
	sort.SliceStable(cs, func(i, j int) bool {
		a, b := cs[i], cs[j]
		if a.Op.phase() != b.Op.phase() {
			return a.Op.phase() < b.Op.phase()
		}
		if a.Op == OpCreate {
			if a.VRAMBytes != b.VRAMBytes {
				return a.VRAMBytes > b.VRAMBytes
			}
			if a.ComputeMilli != b.ComputeMilli {
				return a.ComputeMilli > b.ComputeMilli
			}
		}
		if a.GPU != b.GPU {
			return a.GPU < b.GPU
		}
		if a.Tenant != b.Tenant {
			return a.Tenant < b.Tenant
		}
		if a.Profile != b.Profile {
			return a.Profile < b.Profile
		}
		return a.Instance < b.Instance
	})
}

// host is what Diff read of the host.
type host struct {
	gpus     []manager.GPUView
	insts    []manager.InstanceView
	tenants  map[string]manager.TenantView
	profiles map[string][]manager.ProfileInfo // by model
}

func readHost(m Manager) (*host, error) {
	h := &host{tenants: map[string]manager.TenantView{}, profiles: map[string][]manager.ProfileInfo{}}
	var err error
	if h.gpus, err = m.GPUs(); err != nil {
		return nil, err
	}
	sort.Slice(h.gpus, func(i, j int) bool { return h.gpus[i].PCI < h.gpus[j].PCI })
	if h.insts, err = m.AllInstances(); err != nil {
		return nil, err
	}
	ts, err := m.Tenants()
	if err != nil {
		return nil, err
	}
	for _, t := range ts {
		h.tenants[t.Name] = t
	}
	for _, p := range m.Profiles() {
		h.profiles[p.Model] = append(h.profiles[p.Model], p)
	}
	return h, nil
}

// resolve finds a profile name on a model, accepting what the manager
// accepts: "3g.40gb", "H100-SXM5-80GB/3g.40gb", "H100-3g.40gb",
// "NVIDIA L4-4Q", "passthrough". why says what did not match.
func (h *host) resolve(model, name string) (p manager.ProfileInfo, why string, ok bool) {
	raw := strings.TrimSpace(name)
	want := raw
	if mod, rest, found := strings.Cut(raw, "/"); found {
		if mod != model {
			return p, fmt.Sprintf("%q is a profile of model %s, not of %s", raw, mod, model), false
		}
		want = rest
	}
	want = strings.TrimPrefix(strings.TrimPrefix(want, "NVIDIA "), "GRID ")
	list := h.profiles[model]
	for _, q := range list {
		if q.Name == want {
			return q, "", true
		}
	}
	for _, q := range list {
		if strings.EqualFold(q.Name, want) {
			return q, "", true
		}
	}
	// "H100-3g.40gb": a model-name prefix and a MIG profile.
	if i := strings.Index(want, "-"); i > 0 && strings.HasPrefix(strings.ToLower(model), strings.ToLower(want[:i])) {
		for _, q := range list {
			if q.Kind == string(store.KindMIG) && strings.EqualFold(q.Name, want[i+1:]) {
				return q, "", true
			}
		}
	}
	return p, fmt.Sprintf("%q is not a MIG profile, vGPU type or %q of %s (run `vgpuctl profiles`)", raw, manager.ProfilePassthrough, model), false
}

// profileOf is the canonical profile name of an existing instance.
func (h *host) profileOf(r store.Instance) string {
	if p, _, ok := h.resolve(r.Model, r.Profile); ok && p.Kind == string(r.Kind) {
		return p.Name
	}
	switch {
	case r.TypeName != "":
		return r.TypeName
	case r.Kind == store.KindPassthrough:
		return manager.ProfilePassthrough
	}
	return r.Profile
}

func (h *host) findGPU(id string) (manager.GPUView, bool) {
	for _, g := range h.gpus {
		if g.UUID == id || g.PCI == id || fmt.Sprint(g.Index) == id {
			return g, true
		}
	}
	if norm, err := gpu.NormalizePCI(id); err == nil {
		for _, g := range h.gpus {
			if g.PCI == norm {
				return g, true
			}
		}
	}
	return manager.GPUView{}, false
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

type coverage struct {
	e   *LayoutEntry
	idx int
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
	sortChanges(df.cs.Changes)
	sort.Strings(df.cs.Kept)
	return df.cs, nil
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

// coverage decides which entry describes each GPU.
func (df *differ) coverage() (map[string]coverage, error) {
	cover := map[string]coverage{}
	for i := range df.d.Layout {
		e := &df.d.Layout[i]
		var cands []manager.GPUView
		switch {
		case e.GPU != "":
			g, ok := df.h.findGPU(e.GPU)
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
		fit := 0
		for _, g := range cands {
			if !matchesFilter(g, e.DeviceIDs) {
				continue
			}
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
		case e.All && len(e.Instances) > 0:
			return nil, df.fail(manager.ErrInvalidArgument, e.Source, nil, "no GPU of this host can take %s%s", instanceList(e.Instances), filterNote(e))
		case e.Model != "":
			df.warn("%s: no GPU of model %s%s on this host; nothing to do for it", e.Source, e.Model, filterNote(e))
		case e.GPU != "":
			df.warn("%s: GPU %s does not match the device filter %s; left alone", e.Source, e.GPU, strings.Join(e.DeviceIDs, ","))
		}
	}
	return cover, nil
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

type key struct{ profile, tenant string }

// gpu diffs one covered GPU.
func (df *differ) gpu(g manager.GPUView, e *LayoutEntry, destroyed map[string]bool) error {
	if g.Lost || g.State == "lost" {
		df.warn("%s: GPU %s is lost; it is left as it is until it returns", e.Source, g.PCI)
		return nil
	}
	inScope := func(k store.InstanceKind) bool { return len(e.Scope) == 0 || slices.Contains(e.Scope, k) }
	want := map[key]int{}
	info := map[string]manager.ProfileInfo{}
	var order []key
	needOn, needOff := "", ""
	for j, in := range e.Instances {
		field := fmt.Sprintf("%s.instances[%d]", e.Source, j)
		p, why, ok := df.h.resolve(g.Model, in.Profile)
		if !ok {
			return df.fail(manager.ErrInvalidArgument, field+".profile", nil, "GPU %s: %s", g.PCI, why)
		}
		if !inScope(store.InstanceKind(p.Kind)) {
			return df.fail(manager.ErrInvalidArgument, field+".profile", nil, "%s is a %s profile, outside this entry's scope (%s)", p.Name, p.Kind, scopeList(e.Scope))
		}
		k := key{p.Name, in.Tenant}
		if _, dup := want[k]; dup {
			return df.fail(manager.ErrInvalidArgument, field, nil, "asks again for %s of tenant %s on GPU %s (another spelling of the same profile); give one count", p.Name, in.Tenant, g.PCI)
		}
		want[k] = in.N()
		info[p.Name] = p
		order = append(order, k)
		if in.N() == 0 {
			continue
		}
		switch store.InstanceKind(p.Kind) {
		case store.KindMIG, store.KindMIGVGPU:
			needOn = p.Name
		case store.KindVGPU:
			needOff = p.Name
		}
	}
	if needOn != "" && needOff != "" {
		return df.fail(manager.ErrInvalidArgument, e.Source+".instances", nil, "GPU %s: %s needs MIG on and %s needs it off; they cannot share a GPU", g.PCI, needOn, needOff)
	}
	mode := e.MIG
	if mode != nil {
		switch {
		case *mode && needOff != "":
			return df.fail(manager.ErrInvalidArgument, e.Source+".mig", nil, "MIG on, but the time-sliced vGPU type %s needs it off", needOff)
		case !*mode && needOn != "":
			return df.fail(manager.ErrInvalidArgument, e.Source+".mig", nil, "MIG off, but %s needs it on", needOn)
		}
	} else if needOn != "" || needOff != "" {
		on := needOn != ""
		mode = &on
	}
	if mode != nil && *mode && !g.MIG.Capable {
		return df.fail(manager.ErrInvalidArgument, e.Source, nil, "GPU %s (%s) has no MIG", g.PCI, g.Model)
	}
	modeChange := mode != nil && g.MIG.Capable && *mode != g.MIG.Enabled

	var here []manager.InstanceView
	for _, in := range df.h.insts {
		if in.GPUUUID == g.UUID && in.State != store.StateDestroying {
			here = append(here, in)
		}
	}
	destroy := func(in manager.InstanceView, reason string) {
		destroyed[in.UUID] = true
		df.cs.Changes = append(df.cs.Changes, Change{Op: OpDestroy, GPU: g.PCI, GPUUUID: g.UUID, Model: g.Model, Instance: in.UUID,
			Profile: df.h.profileOf(in.Instance), Kind: string(in.Kind), Tenant: in.Tenant, Reason: reason, Source: e.Source})
	}
	have := map[key]int{}
	if modeChange {
		// The manager changes a MIG mode only on a GPU without instances.
		for _, in := range here {
			destroy(in, fmt.Sprintf("MIG mode changes to %s", onOff(*mode)))
		}
		df.cs.Changes = append(df.cs.Changes, Change{Op: OpSetMIGMode, GPU: g.PCI, GPUUUID: g.UUID, Model: g.Model, MIG: mode, Source: e.Source})
	} else {
		groups := map[key][]manager.InstanceView{}
		for _, in := range here {
			if !inScope(in.Kind) {
				continue
			}
			if in.State == store.StateFailed {
				destroy(in, "failed: "+in.Reason)
				continue
			}
			k := key{df.h.profileOf(in.Instance), in.Tenant}
			groups[k] = append(groups[k], in)
		}
		keys := sortedGroupKeys(groups)
		sel := map[key][]bool{}
		for _, k := range keys {
			ins := groups[k]
			// Keep attached instances first, then the oldest.
			sort.SliceStable(ins, func(i, j int) bool {
				ai, aj := ins[i].Attachment != nil, ins[j].Attachment != nil
				if ai != aj {
					return ai
				}
				if !ins[i].Created.Equal(ins[j].Created) {
					return ins[i].Created.Before(ins[j].Created)
				}
				return ins[i].UUID < ins[j].UUID
			})
			sel[k] = make([]bool, len(ins))
			for i := 0; i < min(want[k], len(ins)); i++ {
				sel[k][i] = true
			}
		}
		if g.MIG.Enabled {
			df.fitMIG(g, here, groups, keys, sel, want, order, info, destroyed)
		}
		for _, k := range keys {
			n := want[k]
			for _, keep := range sel[k] {
				if keep {
					have[k]++
				}
			}
			for i, in := range groups[k] {
				switch {
				case sel[k][i]:
					df.cs.Kept = append(df.cs.Kept, in.UUID)
				case n == 0:
					destroy(in, "not in the layout")
				case have[k] < min(n, len(groups[k])):
					destroy(in, "re-created: where it is, it blocks the slices the layout's new instances need")
				default:
					destroy(in, fmt.Sprintf("the layout asks for %d", n))
				}
			}
		}
	}
	for _, k := range order {
		p := info[k.profile]
		for i := have[k]; i < want[k]; i++ {
			df.cs.Changes = append(df.cs.Changes, Change{Op: OpCreate, GPU: g.PCI, GPUUUID: g.UUID, Model: g.Model,
				Profile: p.Name, Kind: p.Kind, Tenant: k.tenant, VRAMBytes: p.VRAMBytes, ComputeMilli: p.ComputeMilli, Source: e.Source})
		}
	}
	df.foreign(g, e)
	return nil
}

// fitMIG revises which MIG instances to keep so that the ones to create
// find slots (migfit.go). It changes sel only when it finds a way.
func (df *differ) fitMIG(g manager.GPUView, here []manager.InstanceView, groups map[key][]manager.InstanceView, keys []key,
	sel map[key][]bool, want map[key]int, order []key, info map[string]manager.ProfileInfo, destroyed map[string]bool) {
	var creates []string
	for _, k := range order {
		if _, exists := groups[k]; !exists {
			for i := 0; i < want[k]; i++ {
				creates = append(creates, k.profile)
			}
		}
	}
	var migKeys []key
	var gs [][]manager.InstanceView
	var ws []int
	var ps []string
	short := len(creates) > 0
	for _, k := range keys {
		if slots(groups[k][0]) == 0 {
			continue
		}
		migKeys = append(migKeys, k)
		gs = append(gs, groups[k])
		ws = append(ws, want[k])
		p := k.profile
		if pi, ok := info[k.profile]; ok && pi.Kind != string(store.KindMIG) {
			p = "" // a MIG-backed vGPU type: its GPU instance's profile is not known here
		}
		ps = append(ps, p)
		short = short || want[k] > len(groups[k])
	}
	if !short {
		return
	}
	for _, p := range creates {
		if info[p].Kind != string(store.KindMIG) {
			return
		}
	}
	inGroup := map[string]bool{}
	for _, ins := range groups {
		for _, in := range ins {
			inGroup[in.UUID] = true
		}
	}
	// What stays occupied whatever is kept: GPU instances no record
	// explains, and those of instances outside the groups that stay.
	var fixed slotMask
	owned := map[[2]int]bool{}
	for _, in := range df.h.insts {
		if in.GPUUUID != g.UUID {
			continue
		}
		owned[[2]int{in.GIStart, in.GIProfileID}] = true
		if !inGroup[in.UUID] && !destroyed[in.UUID] {
			fixed |= slots(in)
		}
	}
	for _, gi := range g.MIG.Instances {
		if !owned[[2]int{gi.Placement.Start, gi.ProfileID}] {
			fixed |= rangeMask(gi.Placement.Start, gi.Placement.Size)
		}
	}
	choice, ok := newMIGFit(g).chooseKeeps(fixed, gs, ws, creates, ps)
	if !ok {
		return
	}
	for i, k := range migKeys {
		sel[k] = choice[i]
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func scopeList(s []store.InstanceKind) string {
	parts := make([]string, len(s))
	for i, k := range s {
		parts[i] = string(k)
	}
	return strings.Join(parts, ", ")
}

func sortedGroupKeys(m map[key][]manager.InstanceView) []key {
	out := make([]key, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].profile != out[j].profile {
			return out[i].profile < out[j].profile
		}
		return out[i].tenant < out[j].tenant
	})
	return out
}

// foreign warns about devices on a covered GPU that no vgpud record
// explains: apply never touches them, and they hold room the layout may need.
func (df *differ) foreign(g manager.GPUView, e *LayoutEntry) {
	if n := foreignLeft(g, df.h.insts); n > 0 {
		df.warn("%s: GPU %s holds %d devices vgpud did not create; apply leaves them, and they keep their room", e.Source, g.PCI, n)
	}
}

// check refuses change sets that would fail half-way: creates for tenants
// that will not exist or that their quota or allowed lists refuse,
// destroys of attached instances, pruned tenants left owning instances.
func (df *differ) check(final map[string]tenant.Tenant, destroyed map[string]bool) error {
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
