package apply

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/vgpud/vgpud/pkg/tenant"
)

// Op is what a change does.
type Op string

// The operations, in the order Execute performs them.
const (
	OpDestroy        Op = "destroy"
	OpSetMIGMode     Op = "set-mig-mode"
	OpSetScheduler   Op = "set-scheduler"
	OpDefineTenant   Op = "define-tenant"
	OpUpdateTenant   Op = "update-tenant"
	OpUndefineTenant Op = "undefine-tenant"
	OpCreate         Op = "create"
	// OpSetGPUInstanceScheduler pins the scheduler of the GPU instances
	// that hold a layout line's MIG-backed vGPUs (Blackwell GB20x): after
	// the creates, which make those GPU instances (sched_gi.go).
	OpSetGPUInstanceScheduler Op = "set-gpu-instance-scheduler"
)

// phase orders the operations: destroys free room and let MIG modes
// change; the mode must be right before anything is carved, and MIG off
// before a time-sliced scheduler is set; tenants must exist (and have
// their new quotas) before their instances are created.
func (o Op) phase() int {
	switch o {
	case OpDestroy:
		return 0
	case OpSetMIGMode:
		return 1
	case OpSetScheduler:
		return 2
	case OpDefineTenant, OpUpdateTenant:
		return 3
	case OpUndefineTenant:
		return 4
	case OpCreate:
		return 5
	case OpSetGPUInstanceScheduler:
		return 6
	}
	return 7
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
	// ResetSteps: the MIG mode change needs a GPU reset, which vgpud
	// carries through in these steps (for the dry run; Execute ignores
	// them).
	ResetSteps []string `json:"resetSteps,omitempty"`
	// Scheduler is what set-scheduler and set-gpu-instance-scheduler set.
	Scheduler *SchedulerSpec `json:"scheduler,omitempty"`
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
		if len(c.ResetSteps) > 0 {
			s += " through a GPU reset: " + strings.Join(c.ResetSteps, ", ")
		}
	case OpSetScheduler:
		s = fmt.Sprintf("set the vGPU scheduler of %s (%s) to %s", c.GPU, c.Model, c.Scheduler)
	case OpDefineTenant:
		s = fmt.Sprintf("define tenant %s: %s", c.Tenant, c.Settings)
	case OpUpdateTenant:
		s = fmt.Sprintf("update tenant %s: %s", c.Tenant, c.Settings)
	case OpUndefineTenant:
		s = fmt.Sprintf("undefine tenant %s", c.Tenant)
	case OpCreate:
		s = fmt.Sprintf("create %s for tenant %s on %s (%s)", c.Profile, c.Tenant, c.GPU, c.Model)
	case OpSetGPUInstanceScheduler:
		s = fmt.Sprintf("set the vGPU scheduler of the GPU instances holding %s of tenant %s on %s (%s) to %s", c.Profile, c.Tenant, c.GPU, c.Model, c.Scheduler)
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
	// Skipped are the optional entries (those of NVIDIA's formats) that
	// select no GPU of this host, each with why, as mig-parted and
	// vgpu-device-manager skip them.
	Skipped []string `json:"skipped,omitempty"`
	// Warnings are what the operator should know and nothing will change:
	// entries that cover no GPU, lost GPUs, devices vgpud did not create.
	Warnings []string `json:"warnings,omitempty"`
}

// Empty reports whether the host already is as described.
func (cs ChangeSet) Empty() bool { return len(cs.Changes) == 0 }

// String lists the changes one per line, then the skipped entries, then
// the warnings.
func (cs ChangeSet) String() string {
	var b strings.Builder
	for _, c := range cs.Changes {
		b.WriteString(c.String() + "\n")
	}
	for _, s := range cs.Skipped {
		b.WriteString("skipped " + s + "\n")
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
