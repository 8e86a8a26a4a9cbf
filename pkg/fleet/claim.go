package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
	"github.com/vgpud/vgpud/pkg/store"
)

// Syncer is the manager's Fleet.
var _ manager.Fleet = (*Syncer)(nil)

// provider is the desired provider of one GPU, from a fresh read of that
// GPU alone (a claim or settle concerns one GPU; the whole host's view is
// the pass's). ok is false when the host has no such GPU.
func (s *Syncer) provider(gpuUUID string) (p gpuProvider, ok bool, err error) {
	g, err := s.src.FleetGPUByUUID(gpuUUID)
	if errors.Is(err, manager.ErrNotFound) {
		return gpuProvider{}, false, nil
	}
	if err != nil {
		return gpuProvider{}, false, err
	}
	return s.desired([]manager.FleetGPU{g})[0], true, nil
}

// Claim writes c's allocation before the manager carves. Placement's
// capacity refusal is retried once after this GPU's inventory is
// re-published (Placement may hold an older, smaller view); a second
// refusal is the manager's NoCapacity. Whatever an earlier pass met, the
// claim is tried: while Placement was last seen unreachable with a quarter
// of ClaimTimeout.
func (s *Syncer) Claim(ctx context.Context, c manager.FleetClaim) error {
	ctx, cancel := context.WithTimeout(ctx, s.deadline(s.cfg.ClaimTimeout))
	defer cancel()
	p, ok, err := s.provider(c.GPU)
	if err != nil || !ok {
		return fmt.Errorf("GPU %s has no provider: %w", c.GPU, errors.Join(err, placementapi.ErrNotFound))
	}
	// A UUID used again after its instance was destroyed: a pass still in
	// flight must not take the new claim for the old instance's leftover.
	s.reset(c.Instance)
	want := resourcesOf(p.claim(c))
	if p.offers(want) {
		err = s.writeAllocation(ctx, c.Instance, p.uuid, want)
		if errors.Is(err, placementapi.ErrCapacity) {
			s.met.claims.WithLabelValues("republish").Inc()
			if _, perr := s.publishOne(ctx, &p, ""); perr == nil {
				err = s.writeAllocation(ctx, c.Instance, p.uuid, want)
			}
		}
	} else {
		err = s.claimUnoffered(ctx, &p, c.Instance, want)
	}
	s.reached(err)
	switch {
	case errors.Is(err, placementapi.ErrCapacity):
		s.met.claims.WithLabelValues("refused").Inc()
		return fmt.Errorf("placement refused %s on %s: %w: %w", c.Profile, p.name, manager.ErrNoCapacity, err)
	case err != nil:
		s.met.claims.WithLabelValues("failed").Inc()
		return err
	}
	s.met.claims.WithLabelValues("written").Inc()
	return nil
}

// claimUnoffered claims room the host carves but does not offer
// Placement (a 7g.80gb on an empty H100 with carvable inventories, a
// profile fleet.offer leaves out), which a plain claim would find refused
// for want of its class. The GPU's inventories are first written holding
// the claim as if it were carved (effective: every class it takes holds
// what is held and it, nothing free beyond), so that no scheduler takes
// its slices, framebuffer or GPU units meanwhile; then the claim is
// written as any other. The create's settle publishes the GPU's own room
// again. A pass that wrote the GPU's inventories in between makes the
// claim's write a capacity refusal: the two steps are tried twice.
func (s *Syncer) claimUnoffered(ctx context.Context, p *gpuProvider, consumer string, want map[string]int) error {
	s.met.claims.WithLabelValues("unoffered").Inc()
	// The class of a profile no GPU offers may not be defined yet.
	if err := s.ensureList(ctx, sortedKeys(want), false); err != nil {
		return err
	}
	var err error
	for range 2 {
		if _, err = s.syncInventoryFrom(ctx, p, nil, ahead{pending: map[string]map[string]int{consumer: want}}); err != nil {
			return err
		}
		if err = s.writeAllocation(ctx, consumer, p.uuid, want); !errors.Is(err, placementapi.ErrCapacity) {
			return err
		}
	}
	return err
}

// reached notes a claim's or settle's outcome: a Placement that did not
// answer makes the next ones wait less and asks for a pass, which notes
// when it answers again.
func (s *Syncer) reached(err error) {
	s.noteReach(err)
	if err != nil && placementapi.Kind(err) == "unreachable" {
		s.Kick()
	}
}

// publishOne re-publishes one GPU's inventory now, the allocation of
// consumer gone (if not "") not counted: its removal comes next. What it
// read and wrote is cached at the generation the write gave the
// provider, so that the next pass need not read it again: its
// inventories and allocations as read (a DELETE of an allocation, which
// moves no generation, is read by the periodic pass), its traits as the
// last pass left them, unchecked where the generation read is past the
// cache's (a claim moved it). With gone what the provider holds is not
// known until the removal lands (Settle, which knows the generation that
// moves it to).
func (s *Syncer) publishOne(ctx context.Context, p *gpuProvider, gone string) (invOutcome, error) {
	if err := s.ensureNames(ctx, []gpuProvider{*p}); err != nil {
		return invOutcome{}, err
	}
	at := s.now()
	o, err := s.syncInventoryFrom(ctx, p, nil, ahead{gone: gone})
	if err != nil {
		return invOutcome{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.cache[p.uuid]; ok && c.gen <= o.read {
		held := o.held
		if gone != "" {
			held = nil
		}
		// Read at a generation past the cache's (a claim moved it): the
		// inventories and allocations are as read, the traits as the
		// last pass left them, unchecked (as an event's pass takes
		// them), so that the pass after this settle reads the provider
		// again only if something moved it since. A cache already past
		// the read is newer than this and stays.
		s.cache[p.uuid] = cached{gen: o.gen, inv: o.inv, traits: c.traits, held: held, unchecked: c.unchecked || c.gen != o.read, readAt: at}
	}
	return o, nil
}

// Unclaim marks a failed create's claim (or a destroyed instance's
// allocation) for removal at the next pass.
func (s *Syncer) Unclaim(instance string) {
	s.mu.Lock()
	s.gone[instance] = s.now()
	delete(s.seen, instance)
	delete(s.settled, instance)
	s.mu.Unlock()
	s.Kick()
}

// Stale notes that the host refused consumer's allocation on GPU gpuUUID
// as stale, and publishes that GPU's inventories again without it
// (effectiveNow), within a settle's bound (it is no operation's settle,
// and is not counted as one): the scheduler deletes the allocation once
// told, and the totals must not offer its room then. What it cannot
// publish the next pass does.
func (s *Syncer) Stale(ctx context.Context, consumer, gpuUUID string) {
	p, ok, err := s.provider(gpuUUID)
	if err != nil || !ok {
		return
	}
	s.mu.Lock()
	s.refused[consumer] = refusal{provider: p.uuid, at: s.now()}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, s.deadline(s.cfg.SettleTimeout))
	defer cancel()
	_, err = s.publishOne(ctx, &p, "")
	s.reached(err)
	if err != nil {
		s.log.Debug("the inventory after a stale refusal left for the next pass", "consumer", consumer, "gpu", gpuUUID, "err", err)
		s.Kick()
	}
}

// Adopt reads the allocation a scheduler wrote for consumer and returns
// what it names on this host: exactly one of this host's GPU providers,
// one profile class published there and, on MIG GPUs, the slices. A
// refusal of the consumer as stale (Stale) ends: this is a new create.
func (s *Syncer) Adopt(ctx context.Context, consumer string) (manager.FleetClaim, error) {
	s.mu.Lock()
	delete(s.refused, consumer)
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, s.adoptDeadline())
	defer cancel()
	cons, err := s.c.Consumer(ctx, consumer)
	s.reached(err)
	if err != nil {
		return manager.FleetClaim{}, fmt.Errorf("read the allocation of %s: %w: %w", consumer, manager.ErrBackendFailure, err)
	}
	if len(cons.Allocations) == 0 {
		return manager.FleetClaim{}, fmt.Errorf("placement holds no allocation for consumer %s (never written, or removed as stale): %w", consumer, manager.ErrNotFound)
	}
	// The GPU is found by its provider's UUID (derived from its PCI
	// address), and only that GPU is read: the whole host's view is the
	// pass's.
	var found []string
	for _, g := range s.src.Inventory().GPUs {
		if _, ok := cons.Allocations[GPUProviderUUID(s.top(), g.PCI)]; ok && g.Model != "" {
			found = append(found, g.UUID)
		}
	}
	if len(found) != 1 {
		return manager.FleetClaim{}, fmt.Errorf("the allocation of consumer %s names %d of this host's GPU providers, not one (is it for another host?): %w", consumer, len(found), manager.ErrInvalidArgument)
	}
	p, ok, err := s.provider(found[0])
	switch {
	case err != nil:
		return manager.FleetClaim{}, err
	case !ok:
		return manager.FleetClaim{}, fmt.Errorf("the allocation of consumer %s names GPU %s, which this host no longer has: %w", consumer, found[0], manager.ErrInvalidArgument)
	}
	// A scheduler's claim under a UUID an instance destroyed here had
	// (Nova reuses instance UUIDs): not that instance's leftover.
	s.reset(consumer)
	res := cons.Allocations[p.uuid].Resources
	c := unitClaim{Instance: consumer, GPU: p.gpu.UUID}
	for rc, n := range res {
		if rc == SliceClass || rc == FramebufferClass || rc == GPUClass {
			continue
		}
		fc, ok := p.classes[rc]
		if !ok || n != 1 || c.Profile != "" {
			return manager.FleetClaim{}, fmt.Errorf("the allocation of consumer %s on %s holds %s: %d, not one profile this GPU offers: %w", consumer, p.name, rc, n, manager.ErrInvalidArgument)
		}
		c.Profile, c.Kind = fc.Profile, fc.Kind
	}
	if c.Profile == "" {
		return manager.FleetClaim{}, fmt.Errorf("the allocation of consumer %s on %s names no profile class: %w", consumer, p.name, manager.ErrInvalidArgument)
	}
	fc := p.classes[ClassName(c.Kind, c.Profile)]
	c.Slices, c.FramebufferMiB = fc.Slices, fc.FramebufferMiB
	if c.Kind == store.KindPassthrough {
		return wholeGPU(c, &p, res)
	}
	// The slices must be exactly what the profile's GPU instance holds.
	if res[SliceClass] != c.Slices {
		return manager.FleetClaim{}, fmt.Errorf("the allocation of consumer %s on %s holds %s: %d; %s takes %d there: %w", consumer, p.name, SliceClass, res[SliceClass], c.Profile, c.Slices, manager.ErrInvalidArgument)
	}
	// The framebuffer and the GPU's unit must be exactly what the profile
	// takes here, or Placement's accounting of this GPU would drift from
	// the host's; an allocation that left them out is completed before
	// carving.
	want := resourcesOf(c)
	for _, rc := range []string{FramebufferClass, GPUClass} {
		if res[rc] == want[rc] {
			continue
		}
		if res[rc] != 0 {
			return manager.FleetClaim{}, fmt.Errorf("the allocation of consumer %s on %s holds %s: %d; %s takes %d there: %w", consumer, p.name, rc, res[rc], c.Profile, want[rc], manager.ErrInvalidArgument)
		}
		c.Incomplete = true
	}
	return toManager(c), nil
}

// wholeGPU checks a whole-GPU allocation. A scheduler asks for the
// whole-GPU class and all of GPUClass (it cannot know which candidates
// are in MIG or heterogeneous mode, and need not: GPUClass alone keeps
// anything else off the GPU): one that lacks the GPU's slices or
// framebuffer (or, written before GPUClass, that class) is Incomplete, and
// Complete adds them before carving. Amounts the scheduler did write must
// be the whole GPU's, except that its slices may be fewer than the grid:
// with carvable inventories a free GPU's slice class may hold slots back,
// and the claim took what was offered (the pass writes the whole grid
// once the GPU is carved).
func wholeGPU(c unitClaim, p *gpuProvider, res map[string]int) (manager.FleetClaim, error) {
	want := resourcesOf(c)
	for _, rc := range []string{SliceClass, FramebufferClass, GPUClass} {
		switch {
		case res[rc] == want[rc]:
		case rc == SliceClass && res[rc] > 0 && res[rc] < want[rc] && res[rc] >= p.gpu.Slices-p.gpu.Unclaimable-maxHeldBack(p.gpu.Slices):
		case res[rc] == 0:
			c.Incomplete = true
		default:
			return manager.FleetClaim{}, fmt.Errorf("the allocation of consumer %s on %s holds %s: %d; a whole GPU takes %d there: %w", c.Instance, p.name, rc, res[rc], want[rc], manager.ErrInvalidArgument)
		}
	}
	return toManager(c), nil
}

// Complete writes the shared units of an adopted allocation that left
// them out (Adopt marked it Incomplete: a whole GPU's slices or
// framebuffer, a vGPU's framebuffer) once the manager has checked the
// request.
// Placement's capacity refusal is retried once after this GPU's inventory
// is re-published, as Claim does; a second is NoCapacity. An allocation
// the scheduler deleted meanwhile is not written again.
func (s *Syncer) Complete(ctx context.Context, c manager.FleetClaim) error {
	ctx, cancel := context.WithTimeout(ctx, s.adoptDeadline())
	defer cancel()
	p, ok, err := s.provider(c.GPU)
	if err != nil || !ok {
		return fmt.Errorf("GPU %s has no provider: %w: %w", c.GPU, manager.ErrBackendFailure, errors.Join(err, placementapi.ErrNotFound))
	}
	s.reset(c.Instance)
	want := resourcesOf(p.claim(c))
	write := func() error {
		gone := false
		err := s.editConsumer(ctx, c.Instance, func(a map[string]placementapi.Allocation) bool {
			_, held := a[p.uuid]
			gone = !held
			if held {
				a[p.uuid] = placementapi.Allocation{Resources: want}
			}
			return held
		})
		if err == nil && gone {
			return fmt.Errorf("the allocation of consumer %s on %s was deleted meanwhile: %w", c.Instance, p.name, manager.ErrNotFound)
		}
		return err
	}
	err = write()
	if errors.Is(err, placementapi.ErrCapacity) {
		s.met.claims.WithLabelValues("republish").Inc()
		if _, perr := s.publishOne(ctx, &p, ""); perr == nil {
			err = write()
		}
	}
	s.reached(err)
	switch {
	case errors.Is(err, placementapi.ErrCapacity):
		return fmt.Errorf("placement refused %v on %s to consumer %s (claimed there meanwhile): %w: %w", want, p.name, c.Instance, manager.ErrNoCapacity, err)
	case err != nil && !errors.Is(err, manager.ErrNotFound):
		return fmt.Errorf("complete the allocation of %s: %w: %w", c.Instance, manager.ErrBackendFailure, err)
	}
	return err
}

// schedulersToWrite reports whether consumer's allocation on p is a fleet
// scheduler's to write, not the sync's: a create for the scheduler's
// consumer still running (or cut off by a crash, until the start-up
// reconcile settles it) whose allocation Placement does not hold. The
// scheduler deleted it (it gave up, and may have placed the consumer
// elsewhere): writing it back would hold an instance nobody owns.
func schedulersToWrite(p *gpuProvider, consumer string, have map[string]map[string]int) bool {
	if _, ok := have[consumer]; ok {
		return false
	}
	for _, c := range p.gpu.Instances {
		if c.Instance == consumer {
			return c.Unconfirmed
		}
	}
	return false
}

// owner says whose an allocation is, for fleet status: the project, user
// and consumer type Placement holds for consumer (a scheduler's claim shows
// its tenant's project and user; Nova's, written at microversion 1.36,
// have consumer_type "unknown"), "" when they cannot be read.
func (s *Syncer) owner(ctx context.Context, consumer string) string {
	cons, err := s.c.Consumer(ctx, consumer)
	if err != nil || (cons.ProjectID == "" && cons.UserID == "") {
		return ""
	}
	typ := cons.ConsumerType
	if typ == "" {
		typ = "unknown"
	}
	return fmt.Sprintf(" (project %s, user %s, consumer_type %s)", cons.ProjectID, cons.UserID, typ)
}

// Settle brings one GPU's provider up to date right after the manager
// changed the GPU, before the operation returns: the allocation of an
// instance just destroyed goes, and the GPU's inventories are published
// again, so that a scheduler's next look at Placement sees the room the
// change freed or took. It looks the GPU's provider up first, so it works
// on a syncer that has not passed yet (an operation right after start).
// Bounded by SettleTimeout (a quarter of it while Placement was last seen
// unreachable); what it cannot do the next pass does, the removal at once,
// and the error says what was left (the operation stands).
func (s *Syncer) Settle(ctx context.Context, gpuUUID, removed string) error {
	s.beginSettle()
	defer s.endSettle()
	start := s.now()
	outcome := "done"
	defer func() {
		s.met.settles.WithLabelValues(outcome).Inc()
		s.met.settleTime.Observe(s.now().Sub(start).Seconds())
	}()
	if removed != "" {
		// The destroy's event may have marked the allocation (an event
		// taken while this settle runs marks nothing: take) and started
		// a pass: that pass leaves it to this settle, or it would remove
		// it beside the settle, before the settle's publish.
		token := s.markSettling(removed)
		defer s.endSettling(removed, token)
	}
	limit := s.deadline(s.cfg.SettleTimeout)
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	later := func(what string, err error) error {
		outcome = "failed"
		if removed != "" {
			s.Unclaim(removed)
		}
		s.log.Debug(what+" left for the next pass", "gpu", gpuUUID, "consumer", removed, "err", err)
		s.Kick()
		return fmt.Errorf("%s left for the next pass: %w", what, err)
	}
	p, ok, err := s.provider(gpuUUID)
	if err != nil || !ok {
		return later("the GPU's provider", errors.Join(err, placementapi.ErrNotFound))
	}
	if removed == "" {
		_, err = s.publishOne(ctx, &p, "")
		s.reached(err)
		if err != nil {
			return later("the inventory of "+p.name, err)
		}
		return nil
	}
	// The inventories first, as they stand once the allocation is gone,
	// then the allocation. Removed first, its room would be offered
	// beside totals searched with the instance still carved: Placement
	// could accept a mix that the freed slots cannot hold in every order
	// (a stale claim). Until the removal lands, Placement counts the
	// allocation against the new totals (it takes totals below what is
	// held, and logs it): it offers less than the host has, never more.
	// The publish has half the settle's time, so that the removal, which
	// frees the room, still has the rest; the consumer is read beside it.
	// A publish that fails still leaves the removal to go (the room is
	// the host's again), and is tried again after it.
	type consumerRead struct {
		c   placementapi.Consumer
		err error
	}
	pre := make(chan consumerRead, 1)
	go func() {
		c, err := s.c.Consumer(ctx, removed)
		pre <- consumerRead{c, err}
	}()
	pctx, pcancel := context.WithTimeout(ctx, limit/2)
	o, perr := s.publishOne(pctx, &p, removed)
	if ctx.Err() != nil || pctx.Err() == nil {
		// Not the publish's own half running out: Placement slow, not
		// unreachable, is no reason for the short deadlines.
		s.reached(perr)
	} else if perr != nil {
		s.Kick()
	}
	pcancel()
	var read *placementapi.Consumer
	if r := <-pre; r.err == nil {
		read = &r.c
	}
	var on []string
	err = s.lockAlloc(ctx)
	if err == nil {
		// Under allocMu: a pass's write of this allocation is either
		// wholly done (and removed here: the removal is written at the
		// consumer generation read, so a write since makes a conflict
		// and the edit reads again) or sees the instance gone.
		on, err = s.removeAllocationFrom(ctx, removed, read)
		s.unlockAlloc()
	}
	if err == nil || perr != nil || ctx.Err() == nil {
		s.reached(err)
	}
	// Else Placement answered this settle's publish and the removal ran
	// out of the settle's time: Placement slow, not unreachable, is no
	// reason for the short deadlines (a scheduler's next create on this
	// host would get a quarter of its time to read its allocation).
	s.mu.Lock()
	if c, ok := s.cache[p.uuid]; ok && perr == nil && c.gen == o.gen {
		// What the publish cached counted the allocation as gone. The
		// removal written here moved the provider's generation by one:
		// at that generation (unless something else moved it too, and
		// the next pass reads it) the provider holds the inventories
		// published and what they counted.
		delete(s.cache, p.uuid)
		if err == nil && slices.Contains(on, p.uuid) {
			c.gen, c.held = o.gen+1, o.held
			s.cache[p.uuid] = c
		}
	}
	if err == nil {
		s.settled[removed] = s.now()
	}
	s.mu.Unlock()
	if err != nil {
		return later("the allocation of destroyed instance "+removed, errors.Join(err, perr))
	}
	if perr != nil {
		// The removal went without the publish before it: publish now,
		// with the time left, so that the freed room stands beside
		// totals searched without the instance as soon as may be.
		_, perr = s.publishOne(ctx, &p, "")
		s.reached(perr)
	}
	if perr != nil {
		removed = ""
		return later("the inventory of "+p.name, perr)
	}
	return nil
}

// markSettling notes that a destroy's settle removes consumer's
// allocation now and returns the token of that settle: the passes leave
// the allocation to it (a pass's removal, which does not publish first,
// would offer the room beside inventories that still counted it).
func (s *Syncer) markSettling(consumer string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleSeq++
	s.settling[consumer] = s.settleSeq
	return s.settleSeq
}

// endSettling drops the mark of the settle with token, unless a later
// settle of the same consumer holds it now.
func (s *Syncer) endSettling(consumer string, token uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.settling[consumer] == token {
		delete(s.settling, consumer)
	}
}

// Expect tells the syncer that an operation about to emit its events
// settles its GPU before it returns: the pass those events start waits
// for that settle (at most SettleTimeout, as for a settle running)
// instead of running beside it, and then finds the GPU published. done
// ends the expectation; calling it again does nothing.
func (s *Syncer) Expect() (done func()) {
	s.beginSettle()
	var once sync.Once
	return func() { once.Do(s.endSettle) }
}

// beginSettle and endSettle count a settle running (waitSettles).
func (s *Syncer) beginSettle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running == 0 {
		s.idle = make(chan struct{})
	}
	s.running++
}

func (s *Syncer) endSettle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running--
	if s.running == 0 {
		close(s.idle)
	}
}

// waitSettles waits, at most d, until no settle runs and none is
// expected (Expect).
func (s *Syncer) waitSettles(ctx context.Context, d time.Duration) {
	s.mu.Lock()
	idle := s.idle
	running := s.running > 0
	s.mu.Unlock()
	if !running {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
	case <-ctx.Done():
	}
}

// isSettling reports whether a destroy's settle removes consumer's
// allocation now.
func (s *Syncer) isSettling(consumer string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.settling[consumer]
	return ok
}
