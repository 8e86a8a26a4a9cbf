package fleet

import (
	"context"
	"fmt"
)

// Top is the provider this syncer publishes the GPUs under: its root, or
// the parentUUID it was given.
func (s *Syncer) Top() string { return s.top() }

// Retire removes what this syncer published from Placement, for settings
// that move the host to another tree (fleet.host, rootUUID, parentUUID
// changed on reload): its GPU providers (those carrying
// CUSTOM_VGPUD_MANAGED under its top, with what is allocated on them) and
// its own root, never a parentUUID's provider, which belongs to
// nova-compute. The syncer must not be running.
func (s *Syncer) Retire(ctx context.Context) error {
	tree, err := s.c.Tree(ctx, s.top())
	if err != nil {
		return fmt.Errorf("read the provider tree %s: %w", s.top(), err)
	}
	if len(tree) == 0 {
		return nil // never published, or gone with Placement's database
	}
	if err := s.removeStale(ctx, tree, nil); err != nil {
		return err
	}
	if s.cfg.ParentUUID != "" {
		return nil
	}
	if err := s.c.DeleteProvider(ctx, s.top()); err != nil {
		return fmt.Errorf("delete the root provider %s: %w", s.cfg.Host, err)
	}
	s.log.Info("placement provider tree of the former settings removed", "root", s.top(), "host", s.cfg.Host)
	return nil
}
