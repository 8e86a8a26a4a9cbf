package fleet

import (
	"context"
	"fmt"
)

// ensureNames makes sure every class and trait want names exists in
// Placement. The names already made or seen are remembered; the first
// time one is missing, the classes (or traits) Placement knows are listed
// in one request, and only those it lacks are created: a host's first
// publish asks two lists, not one PUT per name, and a fleet whose first
// host made the names creates none of them again.
func (s *Syncer) ensureNames(ctx context.Context, want []gpuProvider) error {
	var classes, traits []string
	for _, p := range want {
		classes = append(classes, sortedKeys(p.inv)...)
		traits = append(traits, p.traits...)
	}
	if err := s.ensureList(ctx, classes, false); err != nil {
		return err
	}
	return s.ensureList(ctx, traits, true)
}

// ensureList is ensureNames for classes or for traits.
func (s *Syncer) ensureList(ctx context.Context, names []string, trait bool) error {
	missing := s.unmade(names)
	if len(missing) == 0 {
		return nil
	}
	s.mu.Lock()
	listed := s.listed[trait]
	s.mu.Unlock()
	if !listed {
		var known []string
		var err error
		if trait {
			known, err = s.c.ListTraits(ctx, "CUSTOM_")
		} else {
			known, err = s.c.ResourceClasses(ctx)
		}
		if err != nil {
			return fmt.Errorf("list what Placement defines: %w", err)
		}
		s.mu.Lock()
		for _, n := range known {
			s.made[n] = true
		}
		s.listed[trait] = true
		s.mu.Unlock()
		missing = s.unmade(missing)
	}
	for _, n := range missing {
		if err := s.ensureName(ctx, n, trait); err != nil {
			return err
		}
	}
	return nil
}

// unmade is the names of list not known to exist, each once.
func (s *Syncer) unmade(list []string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	seen := map[string]bool{}
	for _, n := range list {
		if !s.made[n] && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}

// forgetNames drops what is remembered of the classes and traits
// Placement defines: a write it refused (a 400, as for an unknown class or
// trait) may mean it lost them, and the next pass lists them again.
func (s *Syncer) forgetNames() {
	s.mu.Lock()
	s.made, s.listed = map[string]bool{}, map[bool]bool{}
	s.mu.Unlock()
}

func (s *Syncer) ensureName(ctx context.Context, name string, trait bool) error {
	s.mu.Lock()
	done := s.made[name]
	s.mu.Unlock()
	if done {
		return nil
	}
	var err error
	if trait {
		err = s.c.EnsureTrait(ctx, name)
	} else {
		err = s.c.EnsureResourceClass(ctx, name)
	}
	if err != nil {
		return fmt.Errorf("define %s: %w", name, err)
	}
	s.mu.Lock()
	s.made[name] = true
	s.mu.Unlock()
	return nil
}
