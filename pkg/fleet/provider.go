package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// conflictRetries bounds re-reads after a generation conflict.
const conflictRetries = 4

// syncProvider makes one GPU's provider, inventories, traits and
// allocations equal the host's. A provider whose generation is what the
// last pass left, with the same wishes, is not read again.
func (s *Syncer) syncProvider(ctx context.Context, p *gpuProvider, gens map[string]int, names map[string]string) error {
	gen, exists := gens[p.uuid]
	if exists && names[p.uuid] != p.name {
		return fmt.Errorf("provider %s is named %q, not %q: %w", p.uuid, names[p.uuid], p.name, placementapi.ErrBadRequest)
	}
	if !exists {
		if err := s.c.CreateProvider(ctx, p.uuid, p.name, s.top()); err != nil {
			return fmt.Errorf("create provider %s: %w", p.name, err)
		}
		gen = 0
	}
	s.mu.Lock()
	c, hit := s.cache[p.uuid]
	s.mu.Unlock()
	if hit && exists && c.gen == gen && sameInventories(c.inv, p.inv) && sameSet(c.traits, p.traits) && sameAllocs(c.allocs, p.allocs) && !s.pending() {
		return nil
	}
	s.crash(manager.CrashFleetProvider)
	if err := s.syncInventory(ctx, p); err != nil {
		return err
	}
	s.crash(manager.CrashFleetInventory)
	if err := s.syncTraits(ctx, p); err != nil {
		return err
	}
	if err := s.syncAllocations(ctx, p); err != nil {
		return err
	}
	// The allocations written bumped the generation: read it so the next
	// pass can skip this provider.
	pr, err := s.c.Provider(ctx, p.uuid)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.cache[p.uuid] = cached{gen: pr.Generation, inv: p.inv, traits: p.traits, allocs: p.allocs}
	s.mu.Unlock()
	return nil
}

// pending reports whether claims await removal or grace (a pass must look).
func (s *Syncer) pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.gone) > 0 || len(s.seen) > 0
}

// syncInventory writes the provider's inventories when they differ, at the
// generation just read; a conflict (an allocation landed in between)
// re-reads and retries.
func (s *Syncer) syncInventory(ctx context.Context, p *gpuProvider) error {
	drain := false
	for try := 0; ; try++ {
		cur, gen, err := s.c.Inventories(ctx, p.uuid)
		if err != nil {
			return err
		}
		if sameInventories(cur, p.inv) {
			return nil
		}
		want := p.inv
		if drain {
			want = drained(p.inv, cur)
		}
		_, err = s.c.SetInventories(ctx, p.uuid, gen, want)
		if errors.Is(err, placementapi.ErrConflict) && try < conflictRetries {
			s.met.conflicts.Inc()
			continue
		}
		if errors.Is(err, placementapi.ErrCapacity) && !drain {
			// A class the GPU no longer offers still holds allocations
			// (an instance just destroyed, whose allocation this pass
			// removes after the inventories, or a claim not yet
			// adopted): keep it fully reserved, and drop it next pass.
			drain = true
			s.Kick()
			continue
		}
		if err != nil {
			return fmt.Errorf("inventories of %s: %w", p.name, err)
		}
		return nil
	}
}

// syncTraits is syncInventory for traits.
func (s *Syncer) syncTraits(ctx context.Context, p *gpuProvider) error {
	for try := 0; ; try++ {
		cur, gen, err := s.c.Traits(ctx, p.uuid)
		if err != nil {
			return err
		}
		if sameSet(cur, p.traits) {
			return nil
		}
		_, err = s.c.SetTraits(ctx, p.uuid, gen, p.traits)
		if errors.Is(err, placementapi.ErrConflict) && try < conflictRetries {
			s.met.conflicts.Inc()
			continue
		}
		if err != nil {
			return fmt.Errorf("traits of %s: %w", p.name, err)
		}
		return nil
	}
}

// syncAllocations writes each instance's allocation and removes those of
// consumers that are no instance: at once for instances that went and
// claims a failed create dropped, after Grace for the rest (a scheduler
// between its claim and its create).
func (s *Syncer) syncAllocations(ctx context.Context, p *gpuProvider) error {
	have, err := s.c.ProviderAllocations(ctx, p.uuid)
	if err != nil {
		return err
	}
	var errs []error
	for consumer, want := range p.allocs {
		if sameResources(have[consumer], want) || schedulersToWrite(p, consumer, have) {
			continue
		}
		if !s.src.HasInstance(consumer) {
			// Destroyed since this pass read the host (and its
			// allocation removed by the destroy): not written back.
			continue
		}
		if err := s.writeAllocation(ctx, consumer, p.uuid, want); err != nil {
			errs = append(errs, fmt.Errorf("allocation of %s: %w", consumer, err))
			continue
		}
		s.crash(manager.CrashFleetAlloc)
	}
	now := time.Now()
	for consumer := range have {
		if _, ok := p.allocs[consumer]; ok {
			continue
		}
		if !s.expired(consumer, now) {
			continue
		}
		if err := s.removeAllocation(ctx, consumer); err != nil {
			errs = append(errs, fmt.Errorf("remove allocation of %s: %w", consumer, err))
			continue
		}
		s.log.Info("placement allocation without an instance removed", "consumer", consumer, "provider", p.name)
		s.met.orphans.Inc()
		s.crash(manager.CrashFleetUnalloc)
	}
	return errors.Join(errs...)
}

// expired reports whether consumer's allocation, which names no instance,
// should go now.
func (s *Syncer) expired(consumer string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known[consumer] || s.gone[consumer] {
		return true
	}
	first, ok := s.seen[consumer]
	if !ok {
		s.seen[consumer] = now
		return false
	}
	return now.Sub(first) >= s.cfg.Grace
}

// ours reports whether provider is one of this host's GPU providers.
func (s *Syncer) ours(provider string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.owned[provider]
}

// writeAllocation makes consumer hold want on provider and nothing else
// on this host's providers; what it holds elsewhere (nova's VCPU, another
// host) is kept as it is.
func (s *Syncer) writeAllocation(ctx context.Context, consumer, provider string, want map[string]int) error {
	return s.editConsumer(ctx, consumer, func(a map[string]placementapi.Allocation) {
		for pu := range a {
			if s.ours(pu) {
				delete(a, pu)
			}
		}
		a[provider] = placementapi.Allocation{Resources: want}
	})
}

// removeAllocation drops what consumer holds on this host's providers.
func (s *Syncer) removeAllocation(ctx context.Context, consumer string) error {
	err := s.editConsumer(ctx, consumer, func(a map[string]placementapi.Allocation) {
		for pu := range a {
			if s.ours(pu) {
				delete(a, pu)
			}
		}
	})
	if errors.Is(err, placementapi.ErrNotFound) {
		// Deleted meanwhile (a scheduler dropping its refused claim while
		// the pass removes it): what the pass wanted.
		err = nil
	}
	if err == nil {
		s.mu.Lock()
		delete(s.seen, consumer)
		delete(s.gone, consumer)
		delete(s.known, consumer)
		s.mu.Unlock()
	}
	return err
}

// editConsumer reads a consumer, edits its allocations and writes them at
// the generation read, re-reading after a conflict.
func (s *Syncer) editConsumer(ctx context.Context, consumer string, edit func(map[string]placementapi.Allocation)) error {
	var learnt *int
	for try := 0; ; try++ {
		cur, err := s.c.Consumer(ctx, consumer)
		if err != nil {
			return err
		}
		if cur.Generation == nil && learnt != nil {
			cur.Generation = learnt
		}
		learnt = nil
		before := len(cur.Allocations)
		edit(cur.Allocations)
		if before == 0 && len(cur.Allocations) == 0 {
			return nil
		}
		cur.ConsumerType = ConsumerType
		if cur.ProjectID == "" {
			cur.ProjectID, cur.UserID = s.cfg.ProjectID, s.cfg.UserID
		}
		err = s.c.PutConsumer(ctx, consumer, cur)
		if errors.Is(err, placementapi.ErrConflict) && try < conflictRetries {
			s.met.conflicts.Inc()
			if g, ok := placementapi.ExpectedGeneration(err); ok && cur.Generation == nil {
				learnt = &g
			}
			continue
		}
		return err
	}
}

// removeStale deletes GPU providers of this host's tree whose GPU is gone
// (only providers carrying CUSTOM_VGPUD_MANAGED, under vgpud's top).
func (s *Syncer) removeStale(ctx context.Context, tree []placementapi.Provider, want []gpuProvider) error {
	keep := map[string]bool{}
	for _, p := range want {
		keep[p.uuid] = true
	}
	var errs []error
	for _, p := range tree {
		if p.UUID == s.top() || keep[p.UUID] || p.ParentUUID != s.top() {
			continue
		}
		traits, _, err := s.c.Traits(ctx, p.UUID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !contains(traits, TraitManaged) {
			continue // not vgpud's
		}
		allocs, err := s.c.ProviderAllocations(ctx, p.UUID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.mu.Lock()
		s.cache[p.UUID] = cached{gen: -1}
		s.mu.Unlock()
		for consumer := range allocs {
			if err := s.removeAllocation(ctx, consumer); err != nil {
				errs = append(errs, err)
			}
		}
		if err := s.c.DeleteProvider(ctx, p.UUID); err != nil {
			errs = append(errs, fmt.Errorf("delete provider %s of a GPU that is gone: %w", p.Name, err))
			continue
		}
		s.mu.Lock()
		delete(s.cache, p.UUID)
		s.mu.Unlock()
		s.log.Info("placement provider of a GPU that is gone removed", "provider", p.Name)
	}
	return errors.Join(errs...)
}

// rememberInstances notes the consumers that are instances now: when one
// goes, its allocation goes at the next pass without waiting out Grace.
func (s *Syncer) rememberInstances(want []gpuProvider) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := map[string]bool{}
	known := map[string]bool{}
	for _, p := range want {
		for c := range p.allocs {
			now[c], known[c] = true, true
			delete(s.seen, c)
			delete(s.gone, c)
		}
	}
	// An instance of the last pass that is gone stays known for one more
	// pass, which removes its allocation at once.
	for c := range s.instances {
		known[c] = true
	}
	s.known, s.instances = known, now
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func sameAllocs(a, b map[string]map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !sameResources(v, b[k]) {
			return false
		}
	}
	return true
}

// drained is want plus, fully reserved, the classes of cur that want lacks.
func drained(want, cur map[string]placementapi.Inventory) map[string]placementapi.Inventory {
	out := map[string]placementapi.Inventory{}
	for k, v := range want {
		out[k] = v
	}
	for k, v := range cur {
		if _, ok := out[k]; !ok {
			v.Reserved = v.Total
			out[k] = v
		}
	}
	return out
}
