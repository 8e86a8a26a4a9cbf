package share

import (
	"math"
	"sort"
)

// This file holds the window arithmetic, free of I/O so it is tested alone.

// saturatedFraction is the share of an instance's run time spent in runs
// the scheduler ended (time-sliced) or the busy fraction of its slices
// (MIG) above which it counts as wanting more than it got.
const (
	saturatedRuns = 0.5
	saturatedMIG  = 0.98
)

// Measured is one instance's raw measurement over a window.
type Measured struct {
	// Busy is the fraction of the window it ran (time-sliced) or its
	// slices were busy (MIG).
	Busy float64
	// Saturated: it had more work than it was served.
	Saturated bool
	// Clock is the GPU's mean clock over the window, 1 = full.
	Clock float64
}

// Estimate turns a measurement into the instance's shares:
//
//   - achieved: the GPU compute it received, at full-clock equivalents:
//     Busy × Clock for a time-sliced vGPU (it has the whole GPU while it
//     runs), Busy × its slice share × Clock for MIG;
//   - demand: the achieved share when it was not saturated (it got all it
//     asked for); when saturated, at least its nominal share (an instance
//     that always has work queued is taken to want its share), and at least
//     what it achieved;
//   - interference: max(0, 1 - achieved / min(demand, entitled)), 0 when
//     nothing is owed.
func Estimate(i Instance, m Measured) (achieved, demand, interference float64) {
	clock := m.Clock
	if clock <= 0 || clock > 1 {
		clock = 1
	}
	achieved = m.Busy * clock
	if i.Kind == MIG {
		achieved *= i.Nominal()
	}
	demand = achieved
	if m.Saturated {
		demand = math.Max(achieved, i.Nominal())
	}
	return achieved, demand, Interference(achieved, demand, i.Entitled())
}

// Interference is max(0, 1 - achieved/min(demand, entitled)), 0 when
// min(demand, entitled) is 0 (nothing owed, or nothing wanted).
func Interference(achieved, demand, entitled float64) float64 {
	owed := math.Min(demand, entitled)
	if owed <= 1e-9 {
		return 0
	}
	return math.Max(0, 1-achieved/owed)
}

// Jain is Jain's fairness index (Σx)²/(n·Σx²) over xs: 1 when all are
// equal, 1/n when one has everything. NaN for an empty set.
func Jain(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if s2 == 0 {
		return 1
	}
	return s * s / (float64(len(xs)) * s2)
}

// fairnessInput is an active instance's normalised share for Jain's
// index: achieved over what it could fairly use, min(demand, nominal).
// Instances that want nothing are left out.
func fairnessInput(i Instance, achieved, demand float64) (float64, bool) {
	fair := math.Min(demand, i.Nominal())
	if fair <= 1e-9 {
		return 0, false
	}
	return achieved / fair, true
}

// TenantShare is one tenant's instances summed over a window.
type TenantShare struct {
	Tenant     string
	Guaranteed bool
	// Entitled, Achieved and Demand are sums over its active instances
	// (fractions of a GPU; 2.0 is two GPUs' worth).
	Entitled, Achieved, Demand float64
	// Worst is the highest interference index of its instances, and
	// WorstInstance which one ("" when it has no active instance).
	Worst         float64
	WorstInstance string
	Instances     int
}

// tenantShares sums instances by tenant; tenants with no instance appear
// with zeros.
func tenantShares(tenants []Tenant, shares []InstanceShare) []TenantShare {
	by := map[string]*TenantShare{}
	for _, t := range tenants {
		by[t.Name] = &TenantShare{Tenant: t.Name, Guaranteed: t.Guaranteed}
	}
	for _, s := range shares {
		t := by[s.Tenant]
		if t == nil {
			t = &TenantShare{Tenant: s.Tenant}
			by[s.Tenant] = t
		}
		t.Instances++
		if !s.Active {
			continue
		}
		t.Entitled += s.Entitled
		t.Achieved += s.Achieved
		t.Demand += s.Demand
		if t.WorstInstance == "" || s.Interference > t.Worst {
			t.Worst, t.WorstInstance = s.Interference, s.UUID
		}
	}
	out := make([]TenantShare, 0, len(by))
	for _, t := range by {
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tenant < out[j].Tenant })
	return out
}
