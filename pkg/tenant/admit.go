package tenant

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrQuotaExceeded is wrapped by Admit's error when a request does not fit
// the tenant's quota; errors.As with *QuotaError gives the figures.
var ErrQuotaExceeded = errors.New("quota exceeded")

// ErrNotAllowed is wrapped by Admit's error when the requested model or
// profile is not in the tenant's allowed lists.
var ErrNotAllowed = errors.New("not allowed")

// Usage is what a tenant's existing instances hold.
type Usage struct {
	VRAMBytes    uint64
	ComputeMilli uint64
	Instances    uint64
}

// Request is one new instance to admit.
type Request struct {
	VRAMBytes    uint64
	ComputeMilli uint64
	// Model is the catalog model name of the GPU the instance would land on.
	Model string
	// Profile is the requested profile name (MIG profile or vGPU type).
	Profile string
}

// Resource names a limited resource in a QuotaError.
type Resource string

const (
	ResourceVRAM      Resource = "VRAM"
	ResourceCompute   Resource = "compute"
	ResourceInstances Resource = "instance"
)

// Overage is one quota a request does not fit.
type Overage struct {
	Resource Resource
	Quota    uint64
	Used     uint64
	Request  uint64
}

// Left is what remains of the quota, 0 when usage already exceeds it (the
// quota may have been lowered below what the tenant holds).
func (o Overage) Left() uint64 {
	if o.Used >= o.Quota {
		return 0
	}
	return o.Quota - o.Used
}

func (o Overage) String() string {
	f := formatCount
	unit := ""
	switch o.Resource {
	case ResourceVRAM:
		f = FormatBytes
	case ResourceCompute:
		f, unit = FormatCompute, " GPU"
	}
	return fmt.Sprintf("%s quota %s%s, used %s%s, request %s%s: %s%s left",
		o.Resource, f(o.Quota), unit, f(o.Used), unit, f(o.Request), unit, f(o.Left()), unit)
}

// QuotaError says which quotas a request exceeds, with the figures.
// It wraps ErrQuotaExceeded.
type QuotaError struct {
	Tenant string
	Over   []Overage
}

// Error reads, e.g., "tenant acme: VRAM quota 80GiB, used 60GiB, request
// 40GiB: 20GiB left".
func (e *QuotaError) Error() string {
	parts := make([]string, len(e.Over))
	for i, o := range e.Over {
		parts[i] = o.String()
	}
	return "tenant " + e.Tenant + ": " + strings.Join(parts, "; ")
}

func (e *QuotaError) Unwrap() error { return ErrQuotaExceeded }

// Admit decides whether the tenant, holding u, may add the instance r.
// It returns nil, an error wrapping ErrNotAllowed when r's model or
// profile is not in a non-empty allowed list, or a *QuotaError (wrapping
// ErrQuotaExceeded) naming every quota r does not fit. Names match exactly:
// the catalog's spelling is the canonical one. Sums that overflow uint64
// count as over any quota but Unlimited.
func (t Tenant) Admit(u Usage, r Request) error {
	if len(t.AllowedModels) > 0 && !slices.Contains(t.AllowedModels, r.Model) {
		return fmt.Errorf("tenant %s: %w: model %q is not in its allowed models (%s)",
			t.Name, ErrNotAllowed, r.Model, strings.Join(t.AllowedModels, ", "))
	}
	if len(t.AllowedProfiles) > 0 && !slices.Contains(t.AllowedProfiles, r.Profile) {
		return fmt.Errorf("tenant %s: %w: profile %q is not in its allowed profiles (%s)",
			t.Name, ErrNotAllowed, r.Profile, strings.Join(t.AllowedProfiles, ", "))
	}
	var over []Overage
	for _, c := range []Overage{
		{ResourceVRAM, t.Quota.VRAMBytes, u.VRAMBytes, r.VRAMBytes},
		{ResourceCompute, t.Quota.ComputeMilli, u.ComputeMilli, r.ComputeMilli},
		{ResourceInstances, t.Quota.MaxInstances, u.Instances, 1},
	} {
		if !fits(c.Quota, c.Used, c.Request) {
			over = append(over, c)
		}
	}
	if over != nil {
		return &QuotaError{Tenant: t.Name, Over: over}
	}
	return nil
}

// fits reports whether used+req stays within quota, without overflowing.
func fits(quota, used, req uint64) bool {
	if quota == Unlimited {
		return true
	}
	return used <= quota && req <= quota-used
}
