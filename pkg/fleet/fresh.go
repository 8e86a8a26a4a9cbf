package fleet

import (
	"context"
	"errors"
	"fmt"

	"github.com/vgpud/vgpud/pkg/placementapi"
)

// freshAlloc is an instance's allocation Placement does not hold on the
// instance's provider: after Placement lost its database, every one of
// the host's; otherwise one lost, or one moving between the host's GPUs.
type freshAlloc struct {
	consumer string
	p        *gpuProvider
	want     map[string]int
}

// writeFresh writes the pass's fresh allocations once every provider's
// inventories are written. Two or more go in one POST /allocations, each
// consumer as one Placement must not know yet (consumer generation null):
// that is so after Placement lost its database, when a host has them all
// to write again. Where Placement knows one of them (lost only on this
// provider, held elsewhere, or written meanwhile) the whole request is
// refused, nothing written, and each is written alone as before, at the
// generation read, keeping what it holds elsewhere.
func (s *Syncer) writeFresh(ctx context.Context, ps *passState) []error {
	fresh := ps.fresh
	ps.fresh = nil
	if len(fresh) == 0 {
		return nil
	}
	if len(fresh) > 1 {
		wrote, err := s.postFresh(ctx, fresh)
		if err == nil {
			return s.afterFresh(ctx, wrote, ps)
		}
		s.log.Debug("placement refused the batch of allocations; writing them one by one", "consumers", len(fresh), "err", err)
	}
	var errs []error
	for _, f := range fresh {
		wrote, err := s.writeHeld(ctx, f.consumer, f.p.uuid, f.want)
		if err != nil {
			err = fmt.Errorf("GPU %s: allocation of %s: %w", f.p.gpu.PCI, f.consumer, err)
			s.fail(ps, f.p.name, f.consumer, "allocation", err)
			s.forget(f.p.uuid)
			errs = append(errs, err)
			continue
		}
		if wrote {
			errs = append(errs, s.afterFresh(ctx, []freshAlloc{f}, ps)...)
		}
	}
	return errs
}

// postFresh writes fresh in one request, under allocMu as writeHeld
// writes one: an instance destroyed before is left out, one destroyed
// after has its settle wait for the write. It returns those written.
func (s *Syncer) postFresh(ctx context.Context, fresh []freshAlloc) ([]freshAlloc, error) {
	if err := s.lockAlloc(ctx); err != nil {
		return nil, err
	}
	defer s.unlockAlloc()
	var held []freshAlloc
	body := map[string]placementapi.Consumer{}
	for _, f := range fresh {
		if !s.src.HasConsumer(f.consumer) {
			continue
		}
		held = append(held, f)
		body[f.consumer] = placementapi.Consumer{
			Allocations: map[string]placementapi.Allocation{f.p.uuid: {Resources: f.want}},
			ProjectID:   s.cfg.ProjectID, UserID: s.cfg.UserID, ConsumerType: s.consumerType(f.consumer),
		}
	}
	if len(body) == 0 {
		return nil, nil
	}
	if err := s.c.PostAllocations(ctx, body); err != nil {
		if errors.Is(err, placementapi.ErrConflict) {
			s.met.conflicts.Inc()
		}
		return nil, err
	}
	return held, nil
}

// afterFresh finishes allocations just written: one whose instance was
// destroyed while it was written is removed if its destroy marked it to
// go (destroyedWhileWritten), and the totals its provider raised for it
// lowered.
func (s *Syncer) afterFresh(ctx context.Context, wrote []freshAlloc, ps *passState) []error {
	var errs []error
	for _, f := range wrote {
		if s.destroyedWhileWritten(f.consumer) {
			s.forget(f.p.uuid)
			if _, err := s.removeMarked(ctx, f.consumer); err != nil {
				err = fmt.Errorf("GPU %s: remove allocation of %s, destroyed while it was written: %w", f.p.gpu.PCI, f.consumer, err)
				s.fail(ps, f.p.name, f.consumer, "removal", err)
				errs = append(errs, err)
			}
			if _, _, err := s.syncInventory(ctx, f.p); err != nil {
				s.fail(ps, f.p.name, "inventories", "inventory", err)
				errs = append(errs, fmt.Errorf("GPU %s: %w", f.p.gpu.PCI, err))
			}
		}
		s.crash(CrashAlloc)
	}
	return errs
}

// forget drops what the last pass left in a provider: the next pass reads
// it again.
func (s *Syncer) forget(provider string) {
	s.mu.Lock()
	delete(s.cache, provider)
	s.mu.Unlock()
}
