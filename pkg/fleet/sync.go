package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sort"
	"sync"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// Config is the fleet's part of vgpud.yaml.
type Config struct {
	// Host names the host's providers (<Host>_pci_...).
	Host string
	// RootUUID is the root provider's UUID ("" derives it from Host);
	// ParentUUID an existing provider (nova-compute's) to hang the GPU
	// providers under instead of a root of vgpud's own.
	RootUUID, ParentUUID string
	// Interval is the periodic pass (default 60 s); Grace how long an
	// allocation whose consumer has no instance may live (default 2 min).
	Interval, Grace time.Duration
	// AuditInterval is how often a periodic pass reads the allocations of
	// a GPU's provider that holds only the host's instances' when its
	// generation has not moved (default 5 min, never less than Interval):
	// a DELETE of one, which moves no generation, shows nowhere else. One
	// that holds a claim that is no instance is read by every periodic
	// pass (syncProvider).
	AuditInterval time.Duration
	// ClaimTimeout bounds a create's claim (default 2 s); SettleTimeout
	// what a create or destroy waits for its GPU's provider to be brought
	// up to date before it returns (Settle; default 1 s, never more than
	// ClaimTimeout). While Placement was last seen unreachable both are cut
	// to a quarter, so an operation tries but does not wait long for a
	// Placement that does not answer.
	ClaimTimeout, SettleTimeout time.Duration
	// AdoptTimeout bounds reading a scheduler's allocation for its create
	// and completing it (Adopt, Complete; default 10 s, never less than
	// ClaimTimeout; while Placement was last seen unreachable a quarter of
	// ClaimTimeout, as a claim).
	// A local create carves without its claim when Placement is slow; a
	// scheduler's create cannot, and a refusal costs the scheduler a
	// reschedule, so it waits for a slow Placement longer.
	AdoptTimeout time.Duration
	// Inventories is how a MIG GPU's per-profile totals are published:
	// InventoriesCarvable (the default, ""), or InventoriesExact
	// (carvable.go, docs/fleet.md).
	Inventories string
	// Offer names, per GPU model, the profiles whose classes are published
	// (offer.go; CheckOffer); a model it does not name publishes every
	// profile it can carve.
	Offer map[string][]string
	// ProjectID and UserID are written with vgpud's allocations.
	ProjectID, UserID string
	// Crash is called at the pass's crash points (CrashPoints); nil:
	// never. The daemon passes the hook it gives the manager
	// (manager.CrashAt), so this package reads no environment.
	Crash func(point string)
	// Now is the clock (nil: time.Now): when an allocation without an
	// instance was first seen and so when its Grace ends, when a claim or
	// removal was marked, and how long passes and settles took.
	Now func() time.Time
	// Rand draws in [0, 1) where in its window each retry after a failed
	// pass falls (backoff.go); nil: math/rand/v2.
	Rand func() float64
}

// Source is the host's truth.
type Source interface {
	FleetView() ([]manager.FleetGPU, error)
	// FleetGPUByUUID is one GPU of FleetView, read alone; an error
	// wrapping manager.ErrNotFound when the host has no such GPU.
	FleetGPUByUUID(gpuUUID string) (manager.FleetGPU, error)
	// Inventory is the host's GPUs as last discovered: an adopted
	// allocation's provider names its GPU by PCI address.
	Inventory() gpu.Inventory
	// HasConsumer reports whether a consumer holds an instance's
	// allocation now: the instance's UUID, or while its VM moves to
	// another host the migration's consumer.
	HasConsumer(id string) bool
	Subscribe() (<-chan manager.Event, func())
}

// Syncer publishes the host to Placement and serves the manager's claims.
type Syncer struct {
	cfg Config
	c   *placementapi.Client
	src Source
	log *slog.Logger
	met *Metrics

	kick chan struct{}
	// passMu serialises passes (periodic, event-driven, a claim's re-publish).
	passMu sync.Mutex

	mu sync.Mutex
	// known are consumers that were instances at the last pass: their
	// allocations go at once when the instance does.
	known map[string]bool
	// instances are the consumers that were instances at the last pass.
	instances map[string]bool
	// migrations are the migration consumers of the latest pass's view:
	// their writes keep consumer_type MIGRATION.
	migrations map[string]bool
	// owned are this host's GPU providers (from the latest view).
	owned map[string]bool
	// seen is when an allocation without an instance was first seen (or
	// claimed): it goes after Grace.
	seen map[string]time.Time
	// gone are claims dropped by a failed create and instances removed
	// whose allocation their destroy did not remove: removed at the next
	// pass without grace; the time is when they were marked.
	gone map[string]time.Time
	// settled are instances whose destroy removed their allocation itself:
	// their InstanceRemoved event, taken later, marks nothing.
	settled map[string]time.Time
	// resetAt is, for each consumer reset (a new claim) or removed since
	// the last pass began, the count of resets then (resets): a pass's
	// view read before it is older than that (rememberInstances).
	resetAt map[string]uint64
	resets  uint64
	// refused are consumers whose create the host refused as stale
	// (Stale): the provider their allocation is on, and when. Until the
	// scheduler deletes it, that allocation keeps no total up
	// (effectiveNow); a new create of the consumer, its removal or Grace
	// ends that.
	refused map[string]refusal
	// settling are destroyed instances whose settle runs now, each with
	// its settle's token (from settleSeq): the passes leave their
	// allocation to it (markSettling).
	settling  map[string]uint64
	settleSeq uint64
	// running counts the settles running now and those expected
	// (Expect); idle is closed when it falls back to 0 (waitSettles).
	running int
	idle    chan struct{}
	// offer is Config.Offer as sets of names, by model (nil: all).
	offer map[string]map[string]bool
	// (A successful pass prunes entries of seen, gone and settled marked
	// before it began whose consumer none of the host's providers holds.)
	// lastOK and lastErr are the last pass's outcome; changed is when the
	// host last changed without a pass having published it since.
	lastOK  time.Time
	lastErr error
	changed time.Time
	// failures are the writes the last pass could not make, by subject.
	failures []Difference
	// unreachable: Placement did not answer the last request that tells
	// (a pass's first reads, a claim, a settle). Claims and settles then
	// wait a quarter of their timeout, not the whole.
	unreachable bool
	// allocMu (a one-slot semaphore, so a settle can give up at its
	// deadline) orders a pass's write of an instance's allocation against
	// a destroy's removal of it (writeHeld).
	allocMu chan struct{}
	// cache: provider UUID → what the last pass left there.
	cache map[string]cached
	// made are the classes and traits known to exist in Placement;
	// listed[trait] whether Placement's traits (true) or classes (false)
	// were listed into made since it was last emptied.
	made   map[string]bool
	listed map[bool]bool
	// shapes remembers each GPU's shape while it answered (units.go); the
	// Runner hands every syncer it makes the same one.
	shapes *shapeMemory
	// carves keeps carvable totals by occupancy (carvable.go).
	carves *carveCache
}

type cached struct {
	gen    int
	inv    map[string]placementapi.Inventory
	traits []string
	// held is what the provider held at gen (consumer → resources), nil
	// when not known.
	held map[string]map[string]int
	// unchecked: traits taken as the last pass left them by an event's
	// pass, not read since the generation moved; the periodic pass reads
	// them.
	unchecked bool
	// readAt is when held was last read from Placement (zero: never):
	// the periodic pass reads it again after AuditInterval.
	readAt time.Time
}

// New returns a syncer; Run starts it.
func New(cfg Config, c *placementapi.Client, src Source, log *slog.Logger, met *Metrics) (*Syncer, error) {
	if cfg.Host == "" {
		return nil, fmt.Errorf("fleet: no host name: %w", manager.ErrInvalidArgument)
	}
	if cfg.RootUUID == "" {
		cfg.RootUUID = RootUUID(cfg.Host)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 2 * time.Minute
	}
	if cfg.AuditInterval <= 0 {
		cfg.AuditInterval = 5 * time.Minute
	}
	cfg.AuditInterval = max(cfg.AuditInterval, cfg.Interval)
	if cfg.ClaimTimeout <= 0 {
		cfg.ClaimTimeout = 2 * time.Second
	}
	if cfg.SettleTimeout <= 0 {
		cfg.SettleTimeout = time.Second
	}
	cfg.SettleTimeout = min(cfg.SettleTimeout, cfg.ClaimTimeout)
	if cfg.AdoptTimeout <= 0 {
		cfg.AdoptTimeout = 10 * time.Second
	}
	cfg.AdoptTimeout = max(cfg.AdoptTimeout, cfg.ClaimTimeout)
	switch cfg.Inventories {
	case "":
		cfg.Inventories = InventoriesCarvable
	case InventoriesExact, InventoriesCarvable:
	default:
		return nil, fmt.Errorf("fleet: inventories %q is not %s or %s: %w", cfg.Inventories, InventoriesExact, InventoriesCarvable, manager.ErrInvalidArgument)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ProjectID == "" {
		cfg.ProjectID = "vgpud"
	}
	if cfg.UserID == "" {
		cfg.UserID = "vgpud"
	}
	if met == nil {
		met = NewMetrics()
	}
	return &Syncer{cfg: cfg, c: c, src: src, log: log, met: met, kick: make(chan struct{}, 1), allocMu: make(chan struct{}, 1),
		known: map[string]bool{}, instances: map[string]bool{}, owned: map[string]bool{}, seen: map[string]time.Time{}, gone: map[string]time.Time{},
		settled: map[string]time.Time{}, settling: map[string]uint64{}, resetAt: map[string]uint64{}, refused: map[string]refusal{}, cache: map[string]cached{}, made: map[string]bool{}, listed: map[bool]bool{}, shapes: &shapeMemory{}, carves: &carveCache{}, offer: offerSets(cfg.Offer)}, nil
}

// top is the provider the GPU providers hang under.
func (s *Syncer) top() string {
	if s.cfg.ParentUUID != "" {
		return s.cfg.ParentUUID
	}
	return s.cfg.RootUUID
}

// Run passes at start, after host changes (batched: one pass per burst)
// and every Interval, until ctx ends.
func (s *Syncer) Run(ctx context.Context) {
	events, stop := s.src.Subscribe()
	defer stop()
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	s.Kick()
	// retryC is armed by a failed pass and kept across the events that
	// start no pass, so they cannot put the retry off.
	retry := newBackoff(s.cfg.Interval, s.cfg.Rand)
	var retryC <-chan time.Time
	for {
		// An event's pass reads only the providers whose generation
		// moved; the periodic one (and a retry) also those that hold
		// anything and were not read for AuditInterval (syncProvider).
		readAll := true
		select {
		case <-ctx.Done():
			return
		case e, ok := <-events:
			if !ok {
				return
			}
			s.take(e)
			continue
		case <-tick.C:
		case <-retryC:
		case <-s.kick:
			// Batch a burst: the events of one operation arrive together.
			time.Sleep(20 * time.Millisecond)
			// The operation's settle publishes its GPU now: the pass
			// after it finds that written, where a pass beside it would
			// read and write the same provider too (one inventory write
			// of the two then a conflict, read and sent again).
			s.waitSettles(ctx, s.cfg.SettleTimeout)
			readAll = false
		}
		// Take in every event already there before the pass: a pass
		// takes long enough under load for many to queue, and one left
		// behind would be seen a pass later (an instance's removal
		// unnoticed while its allocation is still held).
		if !s.drain(events) {
			return
		}
		if err := s.passWith(ctx, readAll, s.cfg.AuditInterval); err != nil {
			wait := retry.next()
			retryC = time.After(wait)
			s.log.Warn("placement sync failed; retrying", "err", err, "kind", placementapi.Kind(err), "in", wait)
		} else {
			retry.reset()
			retryC = nil
		}
	}
}

// take notes one host event.
func (s *Syncer) take(e manager.Event) {
	if e.Kind == manager.EventInstanceRemoved {
		// Its allocation goes at the next pass, even if no pass saw the
		// instance, unless its destroy removed it already: a mark left
		// then would sweep a scheduler's later claim under the same UUID
		// (Nova reuses instance UUIDs) without grace.
		// Nor while its settle runs: the settle removes it, or marks it
		// when it gives up (Unclaim). Nor where the consumer was claimed
		// anew or its allocation removed since the last pass began
		// (resetAt): an event queued behind a long pass is older than
		// that claim, and what went since marks itself (a destroy's
		// settle that gives up, a failed create: Unclaim).
		s.mu.Lock()
		_, settling := s.settling[e.ID]
		_, since := s.resetAt[e.ID]
		if _, ok := s.settled[e.ID]; ok {
			delete(s.settled, e.ID)
		} else if !settling && !since {
			s.gone[e.ID] = s.now()
		}
		s.mu.Unlock()
	}
	if relevant(e) {
		s.markChanged()
		s.Kick()
	}
}

// drain takes every event queued now; false when the subscription ended.
func (s *Syncer) drain(events <-chan manager.Event) bool {
	for {
		select {
		case e, ok := <-events:
			if !ok {
				return false
			}
			s.take(e)
		default:
			return true
		}
	}
}

// retryAfter is the wait before the next pass after a failed one, prev the
// wait before it (0: the first failure): doubling from 1 s, never longer
// than the interval, so a Placement that answers again is synced with
// within one interval however long it was down.
func retryAfter(prev, interval time.Duration) time.Duration {
	return min(max(2*prev, time.Second), interval)
}

// crash is the crash hook (Config.Crash) at point.
func (s *Syncer) crash(point string) {
	if s.cfg.Crash != nil {
		s.cfg.Crash(point)
	}
}

func relevant(e manager.Event) bool {
	switch e.Kind {
	case manager.EventInstanceAdded, manager.EventInstanceChanged, manager.EventInstanceRemoved,
		manager.EventGPUChanged, manager.EventGPULost, manager.EventOperationDone, manager.EventOperationFailed:
		return true
	}
	return false
}

// Kick asks for a pass soon.
func (s *Syncer) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Syncer) markChanged() {
	s.mu.Lock()
	if s.changed.IsZero() {
		s.changed = s.now()
	}
	s.mu.Unlock()
}

// Healthy reports whether the last pass succeeded.
func (s *Syncer) Healthy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr == nil && !s.lastOK.IsZero()
}

// Pass makes Placement equal the host once. A write Placement refuses or
// does not answer fails the pass (retried with backoff) but no other
// write of it: each provider and consumer goes on on its own.
func (s *Syncer) Pass(ctx context.Context) error {
	return s.passWith(ctx, true, 0)
}

// passWith is Pass; readAll false (a pass an event started) reads the
// allocations of the providers whose generation moved alone; true, also
// those of each provider that holds any and whose allocations were last
// read audit ago or more (0: every one).
func (s *Syncer) passWith(ctx context.Context, readAll bool, audit time.Duration) error {
	s.passMu.Lock()
	defer s.passMu.Unlock()
	s.mu.Lock()
	since := s.changed
	s.changed = time.Time{}
	s.mu.Unlock()
	start := s.now()
	err := s.pass(ctx, start, readAll, audit)
	s.met.pass(err, s.now().Sub(start))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastErr = err
	if err != nil {
		if s.changed.IsZero() || (!since.IsZero() && since.Before(s.changed)) {
			s.changed = since // still unpublished
		}
		return err
	}
	s.lastOK = s.now()
	if !since.IsZero() {
		s.met.lag.Observe(s.now().Sub(since).Seconds())
	}
	return nil
}

func (s *Syncer) pass(ctx context.Context, start time.Time, readAll bool, audit time.Duration) error {
	s.mu.Lock()
	mark := s.resets
	s.mu.Unlock()
	view, err := s.src.FleetView()
	if err != nil {
		return fmt.Errorf("read the host: %w", err)
	}
	want := s.desired(view)
	ps := &passState{instances: map[string]bool{}, moved: map[string]bool{}, held: map[string]bool{}, complete: true, readAll: readAll, audit: audit, start: start}
	migrations := map[string]bool{}
	for _, p := range want {
		for c := range p.allocs {
			ps.instances[c] = true
		}
		for _, c := range p.gpu.Moved {
			ps.moved[c] = true
		}
		for _, c := range p.gpu.Migrations {
			migrations[c] = true
		}
	}
	s.mu.Lock()
	s.migrations = migrations
	s.mu.Unlock()
	s.removeGone(ctx, ps)
	tree, err := s.prepare(ctx, want)
	s.noteReach(err)
	if err != nil {
		s.setFailures(nil)
		return err
	}
	gens := map[string]int{}
	names := map[string]string{}
	for _, p := range tree {
		gens[p.UUID], names[p.UUID] = p.Generation, p.Name
	}
	var errs []error
	for i := range want {
		if err := s.syncProvider(ctx, &want[i], gens, names, ps); err != nil {
			errs = append(errs, fmt.Errorf("GPU %s: %w", want[i].gpu.PCI, err))
		}
	}
	errs = append(errs, s.writeFresh(ctx, ps)...)
	if err := s.removeStaleIn(ctx, tree, want, ps); err != nil {
		errs = append(errs, err)
	}
	s.rememberInstances(want, mark)
	s.setFailures(ps.failures)
	if ps.complete {
		s.prune(ps.held, start)
	}
	return errors.Join(errs...)
}

// removeGone removes, before anything else of the pass, the allocations
// marked to go at once: those of instances destroyed whose settle could
// not remove them (its deadline ran out under a loaded Placement, say),
// and claims a failed create dropped. A scheduler looking for room waits
// for no provider's reads, and a destroy's room is back after the
// settle's deadline (and the other settles running or expected then:
// the pass waits for them, at most as long) and two requests, whatever
// the host's size. Under allocMu, as a settle removes: one in flight
// finishes first, and what it removed is not removed again; one whose
// settle runs now is left to it (markSettling). One that fails is left
// to the provider's sync, which names it.
func (s *Syncer) removeGone(ctx context.Context, ps *passState) {
	s.mu.Lock()
	var gone []string
	for c := range s.gone {
		if _, settling := s.settling[c]; !ps.instances[c] && !settling {
			gone = append(gone, c)
		}
	}
	s.mu.Unlock()
	sort.Strings(gone)
	for _, c := range gone {
		removed, err := s.removeMarked(ctx, c)
		if err != nil {
			s.log.Debug("allocation to remove left for its provider's sync", "consumer", c, "err", err)
			return // Placement in trouble: the providers' sync reports it
		}
		if removed {
			s.crash(CrashUnalloc)
		}
	}
}

// removeMarked removes what consumer holds if it is still marked to go
// (a new claim under its UUID clears the mark: reset) and no settle runs
// for it, under allocMu as a settle removes: one in flight finishes
// first, and what it removed is not removed again. removed: a removal
// was made.
func (s *Syncer) removeMarked(ctx context.Context, consumer string) (removed bool, err error) {
	if err := s.lockAlloc(ctx); err != nil {
		return false, err
	}
	defer s.unlockAlloc()
	s.mu.Lock()
	_, still := s.gone[consumer]
	_, settling := s.settling[consumer]
	s.mu.Unlock()
	if !still || settling {
		return false, nil
	}
	return true, s.removeAllocation(ctx, consumer)
}

// prepare reads the tree and makes sure the top provider, the classes
// and the traits exist: what every provider's sync needs. The tree answers
// for the top provider too, so a pass over a top that is there asks
// nothing more of Placement; one that is missing from it (none yet, or
// a Placement that lost its database) is made, and the tree read again.
func (s *Syncer) prepare(ctx context.Context, want []gpuProvider) ([]placementapi.Provider, error) {
	tree, err := s.c.Tree(ctx, s.top())
	if err != nil {
		return nil, err
	}
	if !inTree(tree, s.top()) {
		if err := s.ensureTop(ctx); err != nil {
			return nil, err
		}
		if tree, err = s.c.Tree(ctx, s.top()); err != nil {
			return nil, err
		}
	}
	if err := s.ensureNames(ctx, want); err != nil {
		return nil, err
	}
	return tree, nil
}

// inTree reports whether provider id is one of tree.
func inTree(tree []placementapi.Provider, id string) bool {
	for _, p := range tree {
		if p.UUID == id {
			return true
		}
	}
	return false
}

// setFailures keeps the last pass's failed writes for Status.
func (s *Syncer) setFailures(f []Difference) {
	s.mu.Lock()
	s.failures = f
	s.mu.Unlock()
}

// prune drops the bookkeeping of consumers marked before the pass began
// (start) that none of the host's providers holds (held): what they were
// kept for is done, and a consumer UUID used again later (Nova reuses
// instance UUIDs) must start afresh, with its grace.
func (s *Syncer) prune(held map[string]bool, start time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range []map[string]time.Time{s.seen, s.gone, s.settled} {
		for c, at := range m {
			if !held[c] && at.Before(start) {
				delete(m, c)
			}
		}
	}
}

// noteReach notes whether Placement answered a request that tells (err
// nil or any answer: reachable; ErrUnreachable: not).
func (s *Syncer) noteReach(err error) {
	s.mu.Lock()
	s.unreachable = err != nil && placementapi.Kind(err) == "unreachable"
	s.mu.Unlock()
}

// down reports whether Placement was last seen unreachable: claims and
// settles then try with a short deadline.
func (s *Syncer) down() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unreachable
}

// now is the syncer's clock (Config.Now).
func (s *Syncer) now() time.Time { return s.cfg.Now() }

// adoptDeadline is how long reading or completing a scheduler's
// allocation waits now: AdoptTimeout, or while Placement was last seen
// unreachable a quarter of ClaimTimeout, as a claim waits then.
func (s *Syncer) adoptDeadline() time.Duration {
	if s.down() {
		return s.cfg.ClaimTimeout / 4
	}
	return s.cfg.AdoptTimeout
}

// deadline is how long a claim or settle with timeout d waits now.
func (s *Syncer) deadline(d time.Duration) time.Duration {
	if s.down() {
		return d / 4
	}
	return d
}

// reset makes consumer a new claim: protected from the orphan sweep for
// Grace from now, and never taken for a leftover of an earlier instance
// under the same UUID.
func (s *Syncer) reset(consumer string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noteReset(consumer)
	s.seen[consumer] = s.now()
	delete(s.gone, consumer)
	delete(s.known, consumer)
	delete(s.instances, consumer)
	delete(s.settled, consumer)
}

// noteReset counts a new claim of consumer, or the removal of what it
// held, for the pass that read the host before it (rememberInstances).
// The caller holds mu.
func (s *Syncer) noteReset(consumer string) {
	s.resets++
	s.resetAt[consumer] = s.resets
	delete(s.refused, consumer)
}

// desired turns a view into providers and notes them as this host's.
func (s *Syncer) desired(view []manager.FleetGPU) []gpuProvider {
	want := desiredIn(s.cfg.Host, s.top(), s.offered(view), s.shapes, s.cfg.Inventories, s.carves)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range want {
		s.owned[p.uuid] = true
	}
	return want
}

// effectiveNow is effective for p with have on its provider, the
// carvable totals searched again with what the provider holds, or is
// about to hold, beyond the host's instances (uncarvedOn): those claims
// count in Placement's usage, so totals searched from the occupancy alone
// would let Placement accept, beside them, a mix the host cannot carve.
//
// An allocation the host refused as stale (refused) counts for neither:
// the scheduler deletes it, and a total kept up for it would then offer
// its room, which the host cannot carve (the refusal says so), to the
// next claim. Until it is deleted Placement counts it against totals
// below what is held (it takes them, and logs it): it offers less than
// the host has, never more. A class only such allocations hold is kept
// with nothing free (Placement refuses to delete a class in use). While
// the host has an allocation of its own to write on the provider, they
// count as before: Placement would refuse that write against totals
// below what it holds.
func (s *Syncer) effectiveNow(p *gpuProvider, have map[string]map[string]int) map[string]placementapi.Inventory {
	counted, kept := have, map[string]int(nil)
	if !writesPending(p, have) {
		counted, kept = s.withoutRefused(p.uuid, have)
	}
	want := s.effectiveOf(p, counted)
	keepInUse(want, kept)
	return want
}

// keepInUse adds to want, with nothing free, each class of held (class →
// units held by allocations want leaves out) that want lacks: Placement
// refuses to delete a class in use.
func keepInUse(want map[string]placementapi.Inventory, held map[string]int) {
	for rc, n := range held {
		if _, ok := want[rc]; !ok {
			want[rc] = one(n, n, n)
		}
	}
}

func (s *Syncer) effectiveOf(p *gpuProvider, have map[string]map[string]int) map[string]placementapi.Inventory {
	if s.cfg.Inventories != InventoriesCarvable || !p.gpu.MIG {
		return effective(p, have)
	}
	uncarved := uncarvedOn(p, have)
	if len(uncarved) == 0 {
		return effective(p, have)
	}
	q := providerOf(s.cfg.Host, s.top(), p.host, unitsWith(p.host, s.shapes, s.cfg.Inventories, s.carves, uncarved))
	// p's allocations, not only the host's instances: a claim about to
	// be written (claimUnoffered) is counted as the host's.
	q.allocs = p.allocs
	return effective(&q, have)
}

// writesPending reports whether the host wants an allocation on p's
// provider that have (what it holds) lacks or holds otherwise.
func writesPending(p *gpuProvider, have map[string]map[string]int) bool {
	for c, want := range p.allocs {
		if !sameResources(have[c], want) {
			return true
		}
	}
	return false
}

// refusal is where, and when, the host refused a consumer's allocation
// as stale.
type refusal struct {
	provider string
	at       time.Time
}

// withoutRefused is have without the allocations on provider that the
// host refused as stale, and what those hold, by class. A refusal older
// than Grace is forgotten: the pass removes such an allocation by then.
func (s *Syncer) withoutRefused(provider string, have map[string]map[string]int) (map[string]map[string]int, map[string]int) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var counted map[string]map[string]int
	var kept map[string]int
	for c, r := range s.refused {
		if now.Sub(r.at) > s.cfg.Grace {
			delete(s.refused, c)
			continue
		}
		held, ok := have[c]
		if r.provider != provider || !ok {
			continue
		}
		if counted == nil {
			counted, kept = maps.Clone(have), map[string]int{}
		}
		delete(counted, c)
		for rc, n := range held {
			kept[rc] += n
		}
	}
	if counted == nil {
		return have, nil
	}
	return counted, kept
}

// ensureTop makes the root provider, which the tree just read lacks (or
// fails for a configured parent that is missing: vgpud never makes it).
func (s *Syncer) ensureTop(ctx context.Context) error {
	// A root that is gone means a Placement that lost its database:
	// nothing cached about it holds any more.
	s.mu.Lock()
	s.made, s.listed, s.cache = map[string]bool{}, map[bool]bool{}, map[string]cached{}
	s.mu.Unlock()
	if s.cfg.ParentUUID != "" {
		return fmt.Errorf("parent provider %s does not exist in Placement: %w", s.cfg.ParentUUID, placementapi.ErrNotFound)
	}
	if err := s.c.CreateProvider(ctx, s.cfg.RootUUID, s.cfg.Host, ""); err != nil {
		return fmt.Errorf("create root provider %s (%s): %w", s.cfg.Host, s.cfg.RootUUID, err)
	}
	if err := s.ensureList(ctx, []string{TraitManaged}, true); err != nil {
		return err
	}
	_, err := s.c.SetTraits(ctx, s.cfg.RootUUID, 0, []string{TraitManaged})
	return err
}
