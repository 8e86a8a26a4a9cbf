package fleet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/vgpud/vgpud/pkg/placementapi"
)

// conflictRetries bounds re-reads after a generation conflict.
const conflictRetries = 4

// passState is what one pass learns across its providers.
type passState struct {
	// instances are the consumers that are instances anywhere on the host
	// (the view's): their allocation moves with their own write, never
	// removed as an orphan.
	instances map[string]bool
	// moved are instances whose VM moves to another host: their
	// allocation is their migration consumer's, and one under their own
	// UUID on the host's providers goes at once (the UUID is the
	// destination's).
	moved map[string]bool
	// held are the consumers Placement holds on the host's providers.
	held map[string]bool
	// complete is false when a provider's allocations could not be read.
	complete bool
	// readAll: read the allocations of every provider that held any, not
	// only of those whose generation moved, where they were last read
	// audit ago or more (syncProvider).
	readAll bool
	audit   time.Duration
	// start is when the pass began.
	start time.Time
	// failures are the writes Placement refused or did not answer.
	failures []Difference
	// fresh are the instances' allocations Placement does not hold on
	// their provider, written after every provider's inventories.
	fresh []freshAlloc
}

// fail notes one failed write (or read) for fleet status and the metric.
func (s *Syncer) fail(ps *passState, provider, subject, write string, err error) {
	ps.failures = append(ps.failures, Difference{Kind: DiffWriteFailed, Provider: provider, Subject: subject, Host: write, Placement: err.Error()})
	s.met.writeFailures.WithLabelValues(write, placementapi.Kind(err)).Inc()
}

// syncProvider makes one GPU's provider, inventories, traits and
// allocations equal the host's. Every write stands on its own: one
// refused or failing (a consumer's allocation, the inventories) is
// reported and the rest goes on, in this provider and the next.
// The order keeps every class's usage within its capacity: allocations
// that must go are removed first, then the inventories are written with
// each total at least what stays held and what the instances' writes add
// (effective), then the instances' allocations, then the inventories
// again where those writes shrank what is held. The allocations of
// instances Placement does not hold here at all are written after every
// provider's inventories, together where there are several (fresh.go). The inventories and
// traits of a provider whose generation and wishes did not change since
// the last pass are not read again. Its allocations are read where they
// may have changed: on a provider whose generation moved (every
// allocation written bumps the generation of the providers it lands on,
// and so does a removal that leaves its consumer nothing), and on a
// periodic pass (readAll) on every provider that holds a claim that is no
// instance, or held any and was last read AuditInterval ago or more
// (Pass: whenever read), since a DELETE of
// a consumer's allocations, or a consumer rewritten to hold another
// provider's alone, moves no generation of the provider it left: a lost
// allocation shows nowhere else. A pass an event started takes what the
// last pass or settle left at the generation the provider still has, so
// under churn it reads the providers that changed and no other; what a
// generation did not show is found within an AuditInterval (and a
// claim's, or a create's, write on the provider moves its generation and
// has it read at once). Reading every occupied provider every Interval
// was most of what a fleet of idle hosts asked of Placement: a thousand
// hosts of eight occupied GPUs, 150 requests a second. Nothing is read on
// a provider this pass made, or on one that held none at the generation
// it still has, so an idle host's empty GPUs cost Placement nothing.
func (s *Syncer) syncProvider(ctx context.Context, p *gpuProvider, gens map[string]int, names map[string]string, ps *passState) error {
	gen, exists := gens[p.uuid]
	if exists && names[p.uuid] != p.name {
		err := fmt.Errorf("provider %s is named %q, not %q: %w", p.uuid, names[p.uuid], p.name, placementapi.ErrBadRequest)
		s.fail(ps, p.name, p.uuid, "provider", err)
		return err
	}
	if !exists {
		if err := s.c.CreateProvider(ctx, p.uuid, p.name, s.top()); err != nil {
			err = fmt.Errorf("create provider %s: %w", p.name, err)
			s.fail(ps, p.name, p.uuid, "provider", err)
			return err
		}
		gen = 0
	}
	s.crash(CrashProvider)
	s.mu.Lock()
	c, hit := s.cache[p.uuid]
	s.mu.Unlock()
	// known is what the provider holds, and its inventories, at a
	// generation: the inventories' sync starts from it instead of
	// reading the provider again.
	known := &invState{gen: 0, have: map[string]map[string]int{}}
	// readAt is when what the provider holds (held below) was last read
	// from Placement, stamped with the start of the pass (or settle) that
	// read it: a periodic pass reads it again once it began ps.audit
	// after that, less half an Interval, as the periodic passes fall on
	// the ticks, each a little earlier or later into its pass than the
	// last (without that slack, one that fell a millisecond early would
	// leave the read to the pass after it). A provider that holds a claim
	// that is no instance of the host is read by every periodic pass, as
	// before the audit: a scheduler deletes such a claim (one the host
	// refused as stale, one it gave up on) without moving the
	// generation, and the totals kept for it (a class only it held)
	// would offer what the host cannot carve until the audit.
	readAt := ps.start
	audited := ps.start.Sub(c.readAt) < ps.audit-s.cfg.Interval/2 && heldByInstances(c.held, ps.instances)
	switch {
	case !exists:
		// Just made: no inventories, traits or allocations at 0.
	case hit && c.gen == gen && c.held != nil && (len(c.held) == 0 || !ps.readAll || audited):
		known = &invState{gen: gen, inv: c.inv, have: c.held}
		readAt = c.readAt
	default:
		cur, at, have, err := s.readHeld(ctx, p)
		if err != nil {
			ps.complete = false
			s.fail(ps, p.name, p.uuid, "read", err)
			return err
		}
		known = &invState{gen: at, inv: cur, have: have}
	}
	have := maps.Clone(known.have)
	var errs []error
	// Removals first: a class's total falls only once what held it is gone.
	now := s.now()
	for _, consumer := range sortedKeys(have) {
		if _, ok := p.allocs[consumer]; ok || ps.instances[consumer] || s.isSettling(consumer) || (!ps.moved[consumer] && !s.expired(consumer, now)) {
			continue
		}
		removed, err := s.removeUnheld(ctx, consumer, ps.moved[consumer])
		if err != nil {
			err = fmt.Errorf("remove allocation of %s: %w", consumer, err)
			s.fail(ps, p.name, consumer, "removal", err)
			errs = append(errs, err)
			continue
		}
		if !removed {
			continue
		}
		delete(have, consumer)
		known = nil // the removal may have moved the generation
		s.log.Info("placement allocation without an instance removed", "consumer", consumer, "provider", p.name)
		s.met.orphans.Inc()
		s.crash(CrashUnalloc)
	}
	for consumer := range have {
		ps.held[consumer] = true
	}
	// held: what the provider held at invGen.
	written, invGen, held := s.effectiveNow(p, have), gen, have
	skip := hit && exists && c.gen == gen && sameInventories(c.inv, written) && sameSet(c.traits, p.traits) && !(ps.readAll && c.unchecked)
	unchecked := skip && c.unchecked
	if !skip {
		o, err := s.syncInventoryFrom(ctx, p, known, ahead{})
		if err != nil {
			s.fail(ps, p.name, "inventories", "inventory", err)
			errs = append(errs, err)
		}
		written, invGen, held = o.inv, o.gen, o.held
		if o.heldRead {
			readAt = ps.start
		}
		s.crash(CrashInventory)
		var traits *traitState
		if !exists && err == nil {
			traits = &traitState{gen: o.gen}
		}
		// An event's pass takes the traits the last pass left where the
		// host's did not change, as it takes the allocations, and notes
		// them unchecked: another writer's change moved the generation
		// as a claim does, and the periodic pass reads them again.
		unchecked = exists && !ps.readAll && hit && sameSet(c.traits, p.traits)
		if !unchecked {
			from, to, err := s.syncTraitsFrom(ctx, p, traits)
			switch {
			case err != nil:
				s.fail(ps, p.name, "traits", "traits", err)
				errs = append(errs, err)
			case from >= 0 && from == invGen:
				// Written at the generation the inventories left: nothing
				// else moved the provider in between, so what it holds
				// is still held at the generation the write gave it, and
				// the next pass need not read it again (a just-made
				// provider's, after every first publish).
				invGen = to
			}
		}
	}
	again, stale := false, false
	for _, consumer := range sortedKeys(p.allocs) {
		want := p.allocs[consumer]
		if sameResources(have[consumer], want) || schedulersToWrite(p, consumer, have) {
			// A scheduler's claim its create has not confirmed is the
			// scheduler's to write.
			continue
		}
		if have[consumer] == nil {
			// Not held here: written with the pass's other such
			// allocations once every provider's inventories are (fresh.go).
			ps.fresh = append(ps.fresh, freshAlloc{consumer: consumer, p: p, want: want})
			continue
		}
		wrote, err := s.rewriteHeld(ctx, consumer, p.uuid, want)
		if errors.Is(err, errNotHeld) {
			// The cache said it held what a DELETE took since: the
			// provider is read again by the next pass, asked for now
			// (a scheduler's claim it was is not written back).
			stale = true
			s.Kick()
			continue
		}
		if err != nil {
			err = fmt.Errorf("allocation of %s: %w", consumer, err)
			s.fail(ps, p.name, consumer, "allocation", err)
			errs = append(errs, err)
			continue
		}
		if !wrote {
			continue
		}
		again = again || have[consumer] != nil
		if s.destroyedWhileWritten(consumer) {
			// Its totals are lowered below.
			again = true
			if _, err := s.removeMarked(ctx, consumer); err != nil {
				err = fmt.Errorf("remove allocation of %s, destroyed while it was written: %w", consumer, err)
				s.fail(ps, p.name, consumer, "removal", err)
				errs = append(errs, err)
			}
		}
		s.crash(CrashAlloc)
	}
	if again {
		// An allocation rewritten smaller (or removed again) lowers
		// the totals raised for it.
		o, err := s.syncInventoryFrom(ctx, p, nil, ahead{})
		if err != nil {
			s.fail(ps, p.name, "inventories", "inventory", err)
			errs = append(errs, err)
		}
		written, invGen, held = o.inv, o.gen, o.held
		if o.heldRead {
			readAt = ps.start
		}
	}
	if len(errs) > 0 || stale {
		s.mu.Lock()
		delete(s.cache, p.uuid)
		s.mu.Unlock()
		return errors.Join(errs...)
	}
	// The generation Placement gave the inventories this pass read or
	// wrote: any change since (an allocation, an inventory a settle wrote
	// from an older view) makes the next pass read them again; a quiet
	// provider is skipped.
	s.mu.Lock()
	s.cache[p.uuid] = cached{gen: invGen, inv: written, traits: p.traits, held: held, unchecked: unchecked, readAt: readAt}
	s.mu.Unlock()
	return nil
}

// syncInventory writes the provider's inventories when they differ from
// effective ones (the host's, with every capacity at least what is held
// there now), at the generation read before the allocations, so an
// allocation landing in between is a conflict, re-read and retried.
// The host is read again after that generation: a pass's view is older
// than what a settle may have published since (an instance destroyed
// after the pass began), and writing from it would take back room the
// host has. A settle that publishes after this read either lands before
// the write (a conflict: read again) or after it (its view is newer).
// It returns what Placement holds, and the provider's generation then.
func (s *Syncer) syncInventory(ctx context.Context, p *gpuProvider) (map[string]placementapi.Inventory, int, error) {
	o, err := s.syncInventoryFrom(ctx, p, nil, ahead{})
	return o.inv, o.gen, err
}

// invOutcome is what syncInventoryFrom left: the inventories Placement
// holds and the provider's generation then; read, the generation it read
// them at (gen too when nothing was written); held, what the provider
// held at gen (gone not counted), and heldRead whether that was read from
// Placement by this call (else it was known: invState).
type invOutcome struct {
	inv       map[string]placementapi.Inventory
	gen, read int
	held      map[string]map[string]int
	heldRead  bool
}

// invState is a provider's inventories and allocations known without a
// read, at generation gen: one just made has none at 0; one the pass read
// (or knows from the last) has what it read.
type invState struct {
	gen  int
	inv  map[string]placementapi.Inventory
	have map[string]map[string]int
}

// ahead is what an inventory write counts ahead of Placement's
// allocations: pending, allocations (consumer → resources) about to be
// written, counted as the host's beside its instances' (a claim of room
// not offered, claimUnoffered); gone, a consumer whose allocation is
// about to be removed, not counted (a destroy's settle).
type ahead struct {
	pending map[string]map[string]int
	gone    string
}

// syncInventoryFrom is syncInventory starting, when known is not nil,
// from what is known instead of reading it (a conflict reads as usual),
// with the allocations ahead of Placement's counted as they will be.
func (s *Syncer) syncInventoryFrom(ctx context.Context, p *gpuProvider, known *invState, ah ahead) (invOutcome, error) {
	for try := 0; ; try++ {
		var cur map[string]placementapi.Inventory
		var gen int
		var err error
		var have map[string]map[string]int
		heldRead := try > 0 || known == nil
		if heldRead {
			if cur, gen, have, err = s.readHeld(ctx, p); err != nil {
				return invOutcome{}, err
			}
		} else {
			cur, gen, have = known.inv, known.gen, maps.Clone(known.have)
		}
		goneHeld := have[ah.gone]
		delete(have, ah.gone)
		now, err := s.fresh(p)
		if err != nil {
			return invOutcome{}, fmt.Errorf("read GPU %s: %w", p.gpu.PCI, err)
		}
		if len(ah.pending) > 0 {
			allocs := maps.Clone(now.allocs)
			maps.Copy(allocs, ah.pending)
			now.allocs = allocs
		}
		want := s.effectiveNow(&now, have)
		// A class only the allocation about to go holds is kept with
		// nothing free; the next pass drops it.
		keepInUse(want, goneHeld)
		if sameInventories(cur, want) {
			return invOutcome{inv: want, gen: gen, read: gen, held: have, heldRead: heldRead}, nil
		}
		// Totals searched with claims in flight may hold a class no
		// pass has published yet (held back from the occupancy alone).
		if err := s.ensureList(ctx, sortedKeys(want), false); err != nil {
			return invOutcome{}, err
		}
		read := gen
		gen, err = s.c.SetInventories(ctx, p.uuid, gen, want)
		// A capacity refusal (a class in use deleted) means an allocation
		// landed that the read missed: read again, as for a conflict.
		if (errors.Is(err, placementapi.ErrConflict) || errors.Is(err, placementapi.ErrCapacity)) && try < conflictRetries {
			s.met.conflicts.Inc()
			continue
		}
		if errors.Is(err, placementapi.ErrBadRequest) {
			// An unknown class, say: Placement may have lost the names.
			s.forgetNames()
		}
		if err != nil {
			return invOutcome{}, fmt.Errorf("inventories of %s: %w", p.name, err)
		}
		// Written at the generation read before the allocations: none
		// landed since, or the write would have been a conflict.
		return invOutcome{inv: want, gen: gen, read: read, held: have, heldRead: heldRead}, nil
	}
}

// readHeld reads what p's provider holds: the allocations on it, the
// generation Placement read before them, and the inventories at that
// generation. Those are known without a read where this syncer last wrote
// or read them at that very generation (any change to the provider moves
// it); else they are read, and where the generation moved in between, the
// allocations are read again after them.
func (s *Syncer) readHeld(ctx context.Context, p *gpuProvider) (map[string]placementapi.Inventory, int, map[string]map[string]int, error) {
	have, gen, err := s.c.ProviderAllocationsAt(ctx, p.uuid)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("allocations of %s: %w", p.name, err)
	}
	s.mu.Lock()
	c, hit := s.cache[p.uuid]
	s.mu.Unlock()
	if hit && c.gen == gen {
		return c.inv, gen, have, nil
	}
	cur, igen, err := s.c.Inventories(ctx, p.uuid)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("inventories of %s: %w", p.name, err)
	}
	if igen != gen {
		if have, err = s.c.ProviderAllocations(ctx, p.uuid); err != nil {
			return nil, 0, nil, fmt.Errorf("allocations of %s: %w", p.name, err)
		}
	}
	return cur, igen, have, nil
}

// fresh is p as the host has it now (p itself when the host no longer
// has the GPU: what to do with its provider is the pass's).
func (s *Syncer) fresh(p *gpuProvider) (gpuProvider, error) {
	now, ok, err := s.provider(p.host.UUID)
	if err != nil || !ok {
		return *p, err
	}
	return now, nil
}

// traitState is a provider's traits known without a read: none, at gen.
type traitState struct {
	gen int
}

// syncTraitsFrom is syncInventoryFrom for traits: it writes the
// provider's traits where they differ, starting from what is known when
// known is not nil. A write returns the generation it was made at (from)
// and the one Placement gave the provider for it (to); nothing written,
// both are -1.
func (s *Syncer) syncTraitsFrom(ctx context.Context, p *gpuProvider, known *traitState) (from, to int, err error) {
	for try := 0; ; try++ {
		var cur []string
		var gen int
		if try == 0 && known != nil {
			gen = known.gen
		} else {
			if cur, gen, err = s.c.Traits(ctx, p.uuid); err != nil {
				return -1, -1, err
			}
		}
		if sameSet(cur, p.traits) {
			return -1, -1, nil
		}
		to, err = s.c.SetTraits(ctx, p.uuid, gen, p.traits)
		if errors.Is(err, placementapi.ErrConflict) && try < conflictRetries {
			s.met.conflicts.Inc()
			continue
		}
		if errors.Is(err, placementapi.ErrBadRequest) {
			s.forgetNames() // an unknown trait, say
		}
		if err != nil {
			return -1, -1, fmt.Errorf("traits of %s: %w", p.name, err)
		}
		return gen, to, nil
	}
}

// expired reports whether consumer's allocation, which names no instance,
// should go now.
func (s *Syncer) expired(consumer string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, gone := s.gone[consumer]; gone || s.known[consumer] {
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
	return s.writeAllocationIf(ctx, consumer, provider, want, false)
}

// writeAllocationIf is writeAllocation, which with held writes nothing
// unless the consumer holds provider when read (each read, a conflict's
// included): errNotHeld.
func (s *Syncer) writeAllocationIf(ctx context.Context, consumer, provider string, want map[string]int, held bool) error {
	gens := s.heldGens(consumer)
	notHeld := false
	_, err := s.editConsumerFrom(ctx, consumer, nil, func(a map[string]placementapi.Allocation) bool {
		if _, ok := a[provider]; held && !ok {
			notHeld = true
			return false
		}
		notHeld = false
		for pu := range a {
			if s.ours(pu) {
				delete(a, pu)
			}
		}
		a[provider] = placementapi.Allocation{Resources: want}
		return true
	})
	if err == nil && notHeld {
		return errNotHeld
	}
	if err == nil {
		// Moved off another of the host's providers, if it held one:
		// that moved no generation of it.
		s.forgetHeld(consumer, gens, provider)
	}
	return err
}

// writeHeld writes the allocation of an instance the host still holds.
// The check and the write are one step under allocMu, and a destroy's
// settle removes under allocMu after the instance is gone, so the two
// never interleave: an allocation the destroy removed is never put back
// after its reply by a pass that read the host before the destroy. false:
// the instance is gone, nothing written.
func (s *Syncer) writeHeld(ctx context.Context, consumer, provider string, want map[string]int) (bool, error) {
	return s.writeInstance(ctx, consumer, provider, want, false)
}

// rewriteHeld is writeHeld for an allocation the pass took to be held on
// provider already (changed). errNotHeld: it is not, nothing written:
// the pass took it from its cache and a DELETE took it since, which
// moved no generation; an unconfirmed create's allocation deleted so is
// the scheduler's (schedulersToWrite), never written back here.
func (s *Syncer) rewriteHeld(ctx context.Context, consumer, provider string, want map[string]int) (bool, error) {
	return s.writeInstance(ctx, consumer, provider, want, true)
}

func (s *Syncer) writeInstance(ctx context.Context, consumer, provider string, want map[string]int, held bool) (bool, error) {
	if err := s.lockAlloc(ctx); err != nil {
		return false, err
	}
	defer s.unlockAlloc()
	if !s.src.HasConsumer(consumer) {
		return false, nil
	}
	if err := s.writeAllocationIf(ctx, consumer, provider, want, held); err != nil {
		return false, err
	}
	return true, nil
}

// errNotHeld: a consumer no longer holds the provider a pass took it to.
var errNotHeld = errors.New("the allocation is no longer held on the provider")

// heldByInstances reports whether every consumer of held is one of the
// host's instances (or migrations).
func heldByInstances(held map[string]map[string]int, instances map[string]bool) bool {
	for consumer := range held {
		if !instances[consumer] {
			return false
		}
	}
	return true
}

// destroyedWhileWritten reports whether consumer, whose allocation a
// pass just wrote, is no longer an instance: destroyed after the write's
// check. Its removal is the destroy's: its settle removes under allocMu,
// so after the write, reading the consumer again; a settle that gave up,
// or a destroy without one, marked it to go (Unclaim, take), and the
// pass removes it then (removeMarked). Removed on this check alone, it
// could be a new claim under the same UUID (Nova reuses instance UUIDs)
// that the destroy's removal came before: removed without grace.
func (s *Syncer) destroyedWhileWritten(consumer string) bool {
	if s.src.HasConsumer(consumer) {
		return false
	}
	s.Kick() // what the totals still count goes at the next pass
	return true
}

// lockAlloc takes allocMu, or gives up when ctx ends (a pass's write
// holds it for one request at most, bounded by the client's timeout).
func (s *Syncer) lockAlloc(ctx context.Context) error {
	select {
	case s.allocMu <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for the allocation write under way: %w", ctx.Err())
	}
}

func (s *Syncer) unlockAlloc() { <-s.allocMu }

// removeUnheld removes the allocation here of consumer, which the pass
// read as holding nothing. moved: the consumer is an instance's UUID
// whose VM was moving away, and its VM may have stayed (CancelOutgoing
// moving the allocation back) after the pass read the host: the check and
// the removal are one step under allocMu, as writeHeld's, so a move back
// is wholly before the check or after the removal. false: the consumer
// holds an instance's allocation again, nothing removed.
func (s *Syncer) removeUnheld(ctx context.Context, consumer string, moved bool) (bool, error) {
	if !moved {
		return true, s.removeAllocation(ctx, consumer)
	}
	if err := s.lockAlloc(ctx); err != nil {
		return false, err
	}
	defer s.unlockAlloc()
	if s.src.HasConsumer(consumer) {
		return false, nil
	}
	return true, s.removeAllocation(ctx, consumer)
}

// removeAllocation drops what consumer holds on this host's providers.
func (s *Syncer) removeAllocation(ctx context.Context, consumer string) error {
	_, err := s.removeAllocationFrom(ctx, consumer, nil)
	return err
}

// removeAllocationFrom is removeAllocation starting from read, the
// consumer as read just before (nil: read it). It returns the providers
// whose generation the removal moved by exactly one: those it removed the
// consumer from when that left the consumer nothing (editConsumerFrom).
func (s *Syncer) removeAllocationFrom(ctx context.Context, consumer string, read *placementapi.Consumer) ([]string, error) {
	held := s.heldGens(consumer)
	var on []string
	var emptied bool
	var err error
	if read == nil || !s.holdsOurs(read) {
		// Read now (one read before may miss what was written since):
		// a consumer holding nothing of this host's is left as it is. A
		// write of it would move the generations of the providers it
		// holds elsewhere and rewrite its type (a pass took it from its
		// cache, and it was moved away since).
		var cur placementapi.Consumer
		if cur, err = s.c.Consumer(ctx, consumer); err == nil {
			read = &cur
		}
	}
	if err == nil && s.holdsOurs(read) {
		emptied, err = s.editConsumerFrom(ctx, consumer, read, func(a map[string]placementapi.Allocation) bool {
			on = nil
			for pu := range a {
				if s.ours(pu) {
					delete(a, pu)
					on = append(on, pu)
				}
			}
			return len(on) > 0
		})
	}
	if errors.Is(err, placementapi.ErrNotFound) {
		// Deleted meanwhile (a scheduler dropping its refused claim while
		// the pass removes it): what the pass wanted, not written.
		err, on = nil, nil
	}
	if err == nil {
		s.mu.Lock()
		delete(s.seen, consumer)
		delete(s.gone, consumer)
		delete(s.known, consumer)
		// Removed: a later claim under the UUID is not the instance a
		// pass saw, to go at once (rememberInstances).
		delete(s.instances, consumer)
		s.noteReset(consumer)
		s.mu.Unlock()
		s.forgetHeld(consumer, held, "")
	}
	if err != nil || !emptied {
		on = nil
	}
	return on, err
}

// holdsOurs reports whether c holds something of this host's providers.
func (s *Syncer) holdsOurs(c *placementapi.Consumer) bool {
	for pu := range c.Allocations {
		if s.ours(pu) {
			return true
		}
	}
	return false
}

// heldGens is, for each provider the cache says consumer holds
// something of, the cached generation: what forgetHeld may change after
// a write of the consumer.
func (s *Syncer) heldGens(consumer string) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	gens := map[string]int{}
	for pu, c := range s.cache {
		if _, ok := c.held[consumer]; ok {
			gens[pu] = c.gen
		}
	}
	return gens
}

// forgetHeld drops consumer from what the cache says the providers of
// gens (but keep) hold, after a write that left it nothing of theirs: a
// removal that left it something elsewhere, a move to another of the
// host's providers, or a DELETE before either moved no generation that
// would tell the next pass. An entry written at another generation since
// (a pass that read the consumer claimed there again) is left as it is.
func (s *Syncer) forgetHeld(consumer string, gens map[string]int, keep string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for pu, gen := range gens {
		c, ok := s.cache[pu]
		if _, held := c.held[consumer]; !ok || !held || c.gen != gen || pu == keep {
			continue
		}
		c.held = maps.Clone(c.held)
		delete(c.held, consumer)
		s.cache[pu] = c
	}
}

// editConsumer reads a consumer, edits its allocations and writes them at
// the generation read, re-reading after a conflict.
func (s *Syncer) editConsumer(ctx context.Context, consumer string, edit func(map[string]placementapi.Allocation) bool) error {
	_, err := s.editConsumerFrom(ctx, consumer, nil, edit)
	return err
}

// editConsumerFrom is editConsumer starting from read, the consumer as
// read just before (nil: read it). A read that holds nothing is read
// again: what was written since is this edit's too. An edit that returns
// false writes nothing (a consumer that holds none of what it would
// change: a write would still move the generations of the providers it
// holds and rewrite its type). emptied reports that
// the write left the consumer nothing, at the generation read: Placement
// then moved the generation of every provider it held by one (a write
// that leaves some moves only those it still holds; a DELETE, none).
func (s *Syncer) editConsumerFrom(ctx context.Context, consumer string, read *placementapi.Consumer, edit func(map[string]placementapi.Allocation) bool) (emptied bool, err error) {
	var learnt *int
	for try := 0; ; try++ {
		var cur placementapi.Consumer
		if try == 0 && read != nil && len(read.Allocations) > 0 {
			cur = *read
		} else if cur, err = s.c.Consumer(ctx, consumer); err != nil {
			return false, err
		}
		if cur.Generation == nil && learnt != nil {
			cur.Generation = learnt
		}
		learnt = nil
		before := len(cur.Allocations)
		if !edit(cur.Allocations) || (before == 0 && len(cur.Allocations) == 0) {
			return false, nil
		}
		cur.ConsumerType = s.consumerType(consumer)
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
		return err == nil && len(cur.Allocations) == 0 && cur.Generation != nil, err
	}
}

// removeStale deletes GPU providers of this host's tree whose GPU is gone
// (only providers carrying CUSTOM_VGPUD_MANAGED, under vgpud's top).
func (s *Syncer) removeStale(ctx context.Context, tree []placementapi.Provider, want []gpuProvider) error {
	return s.removeStaleIn(ctx, tree, want, &passState{held: map[string]bool{}, complete: true})
}

// removeStaleIn is removeStale within a pass, whose state it adds to.
func (s *Syncer) removeStaleIn(ctx context.Context, tree []placementapi.Provider, want []gpuProvider, ps *passState) error {
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
			ps.complete = false
			errs = append(errs, err)
			continue
		}
		if !contains(traits, TraitManaged) && !madeHere(s.top(), p) {
			continue // not vgpud's
		}
		allocs, err := s.c.ProviderAllocations(ctx, p.UUID)
		if err != nil {
			ps.complete = false
			s.fail(ps, p.Name, p.UUID, "read", err)
			errs = append(errs, err)
			continue
		}
		s.mu.Lock()
		s.cache[p.UUID] = cached{gen: -1}
		s.mu.Unlock()
		for consumer := range allocs {
			if err := s.removeAllocation(ctx, consumer); err != nil {
				ps.held[consumer] = true
				s.fail(ps, p.Name, consumer, "removal", err)
				errs = append(errs, err)
			}
		}
		if err := s.c.DeleteProvider(ctx, p.UUID); err != nil {
			err = fmt.Errorf("delete provider %s of a GPU that is gone: %w", p.Name, err)
			s.fail(ps, p.Name, p.UUID, "provider", err)
			errs = append(errs, err)
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
// mark is the count of resets before the pass read the host (want): a
// consumer reset since (a new claim under the UUID of an instance the
// view still held, destroyed since) or whose allocation was removed since
// (a scheduler may claim under the UUID again without telling the host)
// is not noted, or the next pass would remove the new claim at once.
func (s *Syncer) rememberInstances(want []gpuProvider, mark uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := map[string]bool{}
	known := map[string]bool{}
	for _, p := range want {
		for c := range p.allocs {
			if s.resetAt[c] > mark {
				continue
			}
			now[c], known[c] = true, true
			delete(s.seen, c)
			delete(s.gone, c)
		}
	}
	for c, at := range s.resetAt {
		if at <= mark {
			delete(s.resetAt, c) // every later pass's mark is past it
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
