// Package tenant owns tenants and their quotas: the VRAM, compute and
// instance-count limits a tenant's instances are held to, the models and
// profiles it may use, the parsing and display of quantities ("80GiB",
// "2.5", "2500m", "unlimited"), and admission of a new instance against a
// tenant's current usage.
//
// Everything here is pure: no I/O, no clock, no locks. The caller (the
// manager) reads usage and writes the admitted instance in one store
// transaction, which is what makes admission atomic with other requests.
// It imports nothing from vgpud; any package may import it.
//
// Imports: nothing from vgpud.
package tenant

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Unlimited is the quota value that imposes no limit. It is the largest
// uint64, so a limit check needs no special case for it beyond overflow,
// and it prints as "unlimited".
const Unlimited = ^uint64(0)

// Class says how a tenant's compute is scheduled.
type Class string

const (
	// Guaranteed tenants are entitled to their instances' compute share
	// (see docs/metrics.md, "Shares: the definitions").
	Guaranteed Class = "guaranteed"
	// BestEffort tenants are entitled to nothing but may use idle time.
	BestEffort Class = "best-effort"
)

// ErrInvalidName is wrapped by ValidateName's errors.
var ErrInvalidName = errors.New("invalid tenant name")

// ErrInvalidTenant is wrapped by Tenant.Validate's errors other than a bad name.
var ErrInvalidTenant = errors.New("invalid tenant")

// Quota bounds the sum over a tenant's instances. Each field is Unlimited
// when that resource is not limited.
type Quota struct {
	// VRAMBytes bounds the framebuffer of all instances together.
	VRAMBytes uint64 `json:"vramBytes"`
	// ComputeMilli bounds the entitled compute, in milli-GPU (1000 = one
	// whole GPU).
	ComputeMilli uint64 `json:"computeMilli"`
	// MaxInstances bounds the number of instances.
	MaxInstances uint64 `json:"maxInstances"`
}

// UnlimitedQuota is a quota that limits nothing.
func UnlimitedQuota() Quota {
	return Quota{VRAMBytes: Unlimited, ComputeMilli: Unlimited, MaxInstances: Unlimited}
}

// String renders the quota for logs and CLI output, e.g.
// "vram=80GiB compute=2.5 instances=4".
func (q Quota) String() string {
	return fmt.Sprintf("vram=%s compute=%s instances=%s",
		FormatBytes(q.VRAMBytes), FormatCompute(q.ComputeMilli), formatCount(q.MaxInstances))
}

// Tenant is one tenant: a name, its quota and what it may use.
type Tenant struct {
	// Name is a DNS label (see ValidateName); it keys the tenant everywhere.
	Name  string `json:"name"`
	Quota Quota  `json:"quota"`
	// AllowedModels lists the catalog model names the tenant may use; empty
	// allows any.
	AllowedModels []string `json:"allowedModels,omitempty"`
	// AllowedProfiles lists the profile names (MIG profiles, vGPU types) the
	// tenant may use; empty allows any.
	AllowedProfiles []string  `json:"allowedProfiles,omitempty"`
	Class           Class     `json:"class"`
	Created         time.Time `json:"created"`
}

// ValidateName reports whether name is a DNS label as RFC 1123 defines it:
// 1 to 63 characters of lowercase a-z, 0-9 and '-', neither starting nor
// ending with '-'. Tenant names appear in D-Bus object paths, metric labels
// and libvirt metadata, so they are kept to the one alphabet all of those accept.
func ValidateName(name string) error {
	const rule = "a tenant name is 1-63 characters of a-z, 0-9 and '-', starting and ending with a letter or digit"
	bad := func(why string) error {
		return fmt.Errorf("%w %q: %s; %s", ErrInvalidName, name, why, rule)
	}
	switch {
	case name == "":
		return bad("empty")
	case len(name) > 63:
		return bad(fmt.Sprintf("%d characters long", len(name)))
	case name[0] == '-' || name[len(name)-1] == '-':
		return bad("starts or ends with '-'")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return bad(fmt.Sprintf("character %q at offset %d", c, i))
		}
	}
	return nil
}

// ParseClass returns the class named s ("guaranteed" or "best-effort").
func ParseClass(s string) (Class, error) {
	switch c := Class(s); c {
	case Guaranteed, BestEffort:
		return c, nil
	}
	return "", fmt.Errorf("%w: class %q: want %q or %q", ErrInvalidTenant, s, Guaranteed, BestEffort)
}

// Validate checks the tenant's name, class and allowed lists. The quota
// needs no check: every uint64 is a valid limit.
func (t Tenant) Validate() error {
	if err := ValidateName(t.Name); err != nil {
		return err
	}
	if _, err := ParseClass(string(t.Class)); err != nil {
		return fmt.Errorf("tenant %s: %w", t.Name, err)
	}
	for _, l := range []struct {
		what  string
		names []string
	}{{"allowed models", t.AllowedModels}, {"allowed profiles", t.AllowedProfiles}} {
		seen := make(map[string]bool, len(l.names))
		for _, n := range l.names {
			if strings.TrimSpace(n) == "" {
				return fmt.Errorf("%w: tenant %s: empty name in %s", ErrInvalidTenant, t.Name, l.what)
			}
			if seen[n] {
				return fmt.Errorf("%w: tenant %s: %q listed twice in %s", ErrInvalidTenant, t.Name, n, l.what)
			}
			seen[n] = true
		}
	}
	return nil
}
