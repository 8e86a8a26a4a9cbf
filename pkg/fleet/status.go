package fleet

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/vgpud/vgpud/pkg/placementapi"
)

// Difference kinds Status names.
const (
	DiffProviderMissing   = "provider-missing"   // a GPU of the host has no provider
	DiffProviderStale     = "provider-stale"     // a managed provider whose GPU is gone
	DiffInventoryMissing  = "inventory-missing"  // a class the GPU offers is not published
	DiffInventoryStale    = "inventory-stale"    // a class the GPU no longer offers is published
	DiffInventoryDiffers  = "inventory-differs"  // total, reserved or max_unit differ
	DiffTraitsDiffer      = "traits-differ"      // the provider's traits differ
	DiffAllocationMissing = "allocation-missing" // an instance has no allocation
	DiffAllocationStale   = "allocation-stale"   // an allocation whose consumer is no instance
	DiffAllocationDiffers = "allocation-differs" // an instance's allocation holds other resources
	// DiffWriteFailed is a write the last pass could not make (Subject: the
	// consumer, "inventories", "traits" or the provider; Host: the write;
	// Placement: the error). The pass retries it; the others went on.
	DiffWriteFailed = "write-failed"
)

// Status is what Placement holds against what the host holds.
type Status struct {
	Endpoint, Host, Root string
	// LastSync is the last successful pass (zero: none yet); LastError the
	// last pass's error ("" when it succeeded).
	LastSync  time.Time
	LastError string
	Providers []ProviderStatus
	// Differences is empty when Placement equals the host.
	Differences []Difference
}

// ProviderStatus is one GPU's provider as the host wants it and what
// Placement holds there.
type ProviderStatus struct {
	UUID, Name, GPU string
	// InPlacement is false when the provider is missing.
	InPlacement bool
	// Classes are the union of the host's and Placement's classes there.
	Classes []ClassStatus
	// Allocations: instances on the GPU, and allocations Placement holds.
	HostAllocations, PlacementAllocations int
}

// ClassStatus is one resource class on a provider.
type ClassStatus struct {
	Class                                            string
	HostTotal, HostReserved, HostMaxUnit             int
	PlacementTotal, PlacementReserved, PlacementUsed int
}

// Difference is one way Placement differs from the host: Subject is the
// class, trait set or consumer; Host and Placement say what each holds.
type Difference struct {
	Kind, Provider, Subject, Host, Placement string
}

// Status compares Placement with the host now. It only reads; a pass
// (periodic or event-driven) repairs what it names. An allocation a
// scheduler wrote for a create still on its way shows as stale until the
// create adopts it (or Grace removes it).
func (s *Syncer) Status(ctx context.Context) (Status, error) {
	view, err := s.src.FleetView()
	if err != nil {
		return Status{}, fmt.Errorf("read the host: %w", err)
	}
	want := desiredIn(s.cfg.Host, s.top(), s.offered(view), s.shapes, s.cfg.Inventories, s.carves)
	s.mu.Lock()
	st := Status{Endpoint: s.c.Endpoint(), Host: s.cfg.Host, Root: s.top(), LastSync: s.lastOK}
	if s.lastErr != nil {
		st.LastError = s.lastErr.Error()
	}
	failures := append([]Difference(nil), s.failures...)
	s.mu.Unlock()
	tree, err := s.c.Tree(ctx, s.top())
	if err != nil {
		return st, fmt.Errorf("read the provider tree under %s: %w", s.top(), err)
	}
	inTree := map[string]placementapi.Provider{}
	for _, p := range tree {
		inTree[p.UUID] = p
	}
	for i := range want {
		ps, diffs, err := s.compareProvider(ctx, &want[i], inTree)
		if err != nil {
			return st, err
		}
		st.Providers = append(st.Providers, ps)
		st.Differences = append(st.Differences, diffs...)
	}
	stale, err := s.staleProviders(ctx, tree, want)
	if err != nil {
		return st, err
	}
	st.Differences = append(st.Differences, stale...)
	st.Differences = append(st.Differences, failures...)
	return st, nil
}

func (s *Syncer) compareProvider(ctx context.Context, p *gpuProvider, inTree map[string]placementapi.Provider) (ProviderStatus, []Difference, error) {
	ps := ProviderStatus{UUID: p.uuid, Name: p.name, GPU: p.gpu.PCI, HostAllocations: len(p.allocs)}
	var diffs []Difference
	if _, ok := inTree[p.uuid]; !ok {
		for _, rc := range sortedKeys(p.inv) {
			ps.Classes = append(ps.Classes, ClassStatus{Class: rc, HostTotal: p.inv[rc].Total, HostReserved: p.inv[rc].Reserved, HostMaxUnit: p.inv[rc].MaxUnit})
		}
		return ps, []Difference{{Kind: DiffProviderMissing, Provider: p.name, Subject: p.uuid, Host: "GPU " + p.gpu.PCI, Placement: "none"}}, nil
	}
	ps.InPlacement = true
	inv, _, err := s.c.Inventories(ctx, p.uuid)
	if err != nil {
		return ps, nil, fmt.Errorf("inventories of %s: %w", p.name, err)
	}
	allocs, err := s.c.ProviderAllocations(ctx, p.uuid)
	if err != nil {
		return ps, nil, fmt.Errorf("allocations of %s: %w", p.name, err)
	}
	traits, _, err := s.c.Traits(ctx, p.uuid)
	if err != nil {
		return ps, nil, fmt.Errorf("traits of %s: %w", p.name, err)
	}
	ps.PlacementAllocations = len(allocs)
	// What a pass publishes with these allocations held (effective).
	want := s.effectiveNow(p, allocs)
	used := map[string]int{}
	for _, r := range allocs {
		for rc, n := range r {
			used[rc] += n
		}
	}
	classes := map[string]bool{}
	for rc := range want {
		classes[rc] = true
	}
	for rc := range inv {
		classes[rc] = true
	}
	for _, rc := range sortedKeys(classes) {
		w, inHost := want[rc]
		h, inPl := inv[rc]
		ps.Classes = append(ps.Classes, ClassStatus{Class: rc, HostTotal: w.Total, HostReserved: w.Reserved, HostMaxUnit: w.MaxUnit,
			PlacementTotal: h.Total, PlacementReserved: h.Reserved, PlacementUsed: used[rc]})
		switch {
		case !inPl:
			diffs = append(diffs, Difference{Kind: DiffInventoryMissing, Provider: p.name, Subject: rc, Host: invString(w), Placement: "none"})
		case !inHost:
			diffs = append(diffs, Difference{Kind: DiffInventoryStale, Provider: p.name, Subject: rc, Host: "none", Placement: invString(h)})
		case !sameInventories(map[string]placementapi.Inventory{rc: w}, map[string]placementapi.Inventory{rc: h}):
			diffs = append(diffs, Difference{Kind: DiffInventoryDiffers, Provider: p.name, Subject: rc, Host: invString(w), Placement: invString(h)})
		}
	}
	if !sameSet(traits, p.traits) {
		sort.Strings(traits)
		diffs = append(diffs, Difference{Kind: DiffTraitsDiffer, Provider: p.name, Subject: "traits", Host: fmt.Sprint(p.traits), Placement: fmt.Sprint(traits)})
	}
	for _, consumer := range sortedKeys(p.allocs) {
		got, ok := allocs[consumer]
		switch {
		case !ok:
			diffs = append(diffs, Difference{Kind: DiffAllocationMissing, Provider: p.name, Subject: consumer, Host: resString(p.allocs[consumer]), Placement: "none"})
		case !sameResources(got, p.allocs[consumer]):
			diffs = append(diffs, Difference{Kind: DiffAllocationDiffers, Provider: p.name, Subject: consumer, Host: resString(p.allocs[consumer]), Placement: resString(got) + s.owner(ctx, consumer)})
		}
	}
	for _, consumer := range sortedKeys(allocs) {
		if _, ok := p.allocs[consumer]; !ok {
			diffs = append(diffs, Difference{Kind: DiffAllocationStale, Provider: p.name, Subject: consumer, Host: "no instance", Placement: resString(allocs[consumer]) + s.owner(ctx, consumer)})
		}
	}
	return ps, diffs, nil
}

// staleProviders names managed GPU providers under the top whose GPU the
// host no longer has (the same rule removeStale applies).
func (s *Syncer) staleProviders(ctx context.Context, tree []placementapi.Provider, want []gpuProvider) ([]Difference, error) {
	keep := map[string]bool{}
	for _, p := range want {
		keep[p.uuid] = true
	}
	var diffs []Difference
	for _, p := range tree {
		if p.UUID == s.top() || keep[p.UUID] || p.ParentUUID != s.top() {
			continue
		}
		traits, _, err := s.c.Traits(ctx, p.UUID)
		if err != nil {
			return nil, fmt.Errorf("traits of %s: %w", p.Name, err)
		}
		if contains(traits, TraitManaged) || madeHere(s.top(), p) {
			diffs = append(diffs, Difference{Kind: DiffProviderStale, Provider: p.Name, Subject: p.UUID, Host: "no such GPU", Placement: "provider"})
		}
	}
	return diffs, nil
}

func invString(i placementapi.Inventory) string {
	return fmt.Sprintf("total=%d reserved=%d max_unit=%d", i.Total, i.Reserved, i.MaxUnit)
}

func resString(r map[string]int) string {
	out := ""
	for _, rc := range sortedKeys(r) {
		if out != "" {
			out += ","
		}
		out += fmt.Sprintf("%s=%d", rc, r[rc])
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
