package fleet

import (
	"context"
	"errors"
	"fmt"

	"github.com/vgpud/vgpud/pkg/placementapi"
)

// MigrationConsumerType is the consumer_type of a migration's consumer,
// which holds a moving VM's allocation on the source (Nova's).
const MigrationConsumerType = "MIGRATION"

// Move moves what consumer from holds on this host's providers to
// consumer to, in one POST /allocations naming both (as Nova's
// move_allocations does), so that no moment sees the allocation on both
// consumers or on neither: MigrationSource moves an instance's allocation
// to its migration's consumer, CancelOutgoing moves it back. What either
// holds elsewhere (a destination's claim of the instance) is kept. It runs
// under allocMu, so a pass's write of either consumer is wholly before or
// after it. Bounded by ClaimTimeout (a quarter while Placement was last
// seen unreachable); what it cannot do the next pass does, at once: from's
// allocation here goes, and to's is written as the host's records say.
func (s *Syncer) Move(ctx context.Context, from, to string) error {
	ctx, cancel := context.WithTimeout(ctx, s.deadline(s.cfg.ClaimTimeout))
	defer cancel()
	// The host's providers, known before any pass (a move right after
	// start): its GPUs' providers are derived from their PCI addresses.
	s.mu.Lock()
	for _, g := range s.src.Inventory().GPUs {
		if g.Model != "" {
			s.owned[GPUProviderUUID(s.top(), g.PCI)] = true
		}
	}
	s.mu.Unlock()
	err := s.lockAlloc(ctx)
	if err == nil {
		err = s.move(ctx, from, to)
		s.unlockAlloc()
	}
	s.reached(err)
	if err != nil {
		s.Unclaim(from)
		return fmt.Errorf("move the allocation of %s to %s, left for the next pass: %w", from, to, err)
	}
	return nil
}

// consumerType is the consumer_type a write of consumer stamps: a moving
// VM's migration consumer stays MIGRATION, as Move made it.
func (s *Syncer) consumerType(consumer string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.migrations[consumer] {
		return MigrationConsumerType
	}
	return ConsumerType
}

func (s *Syncer) move(ctx context.Context, from, to string) error {
	for try := 0; ; try++ {
		src, err := s.c.Consumer(ctx, from)
		if err != nil {
			return err
		}
		dst, err := s.c.Consumer(ctx, to)
		if err != nil {
			return err
		}
		moving := map[string]placementapi.Allocation{}
		for pu, a := range src.Allocations {
			if s.ours(pu) {
				moving[pu] = a
				delete(src.Allocations, pu)
			}
		}
		if len(moving) == 0 {
			return nil // moved already (a repeated call), or never written here
		}
		for pu, a := range moving {
			dst.Allocations[pu] = a
		}
		if src.ProjectID == "" {
			src.ProjectID, src.UserID = s.cfg.ProjectID, s.cfg.UserID
		}
		if dst.ProjectID == "" {
			// The migration's consumer is the instance's owner's, as Nova's.
			dst.ProjectID, dst.UserID = src.ProjectID, src.UserID
		}
		if src.ConsumerType == "" {
			src.ConsumerType = ConsumerType
		}
		if dst.ConsumerType == "" || len(dst.Allocations) == len(moving) {
			dst.ConsumerType = MigrationConsumerType
			if src.ConsumerType == MigrationConsumerType {
				dst.ConsumerType = ConsumerType
			}
		}
		err = s.c.PostAllocations(ctx, map[string]placementapi.Consumer{from: src, to: dst})
		if errors.Is(err, placementapi.ErrConflict) && try < conflictRetries {
			s.met.conflicts.Inc()
			continue
		}
		return err
	}
}
