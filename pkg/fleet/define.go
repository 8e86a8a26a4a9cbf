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

// ensureList is ensureNames for classes or for traits. A name Placement
// answers it had already (204, not 201) means another writer is defining
// them now (every host of a fleet after Placement lost its database): the
// list is read again, once, and only what is still missing is created,
// instead of every host creating every name.
func (s *Syncer) ensureList(ctx context.Context, names []string, trait bool) error {
	missing := s.unmade(names)
	if len(missing) == 0 {
		return nil
	}
	s.mu.Lock()
	listed := s.listed[trait]
	s.mu.Unlock()
	if !listed {
		if err := s.list(ctx, trait); err != nil {
			return err
		}
		missing = s.unmade(missing)
	}
	relisted := false
	for i := 0; i < len(missing); i++ {
		n := missing[i]
		if s.unmade([]string{n}) == nil {
			continue
		}
		created, err := s.define(ctx, n, trait)
		if err != nil {
			return fmt.Errorf("define %s: %w", n, err)
		}
		if !created && !relisted && i+1 < len(missing) {
			relisted = true
			if err := s.list(ctx, trait); err != nil {
				return err
			}
		}
	}
	return nil
}

// list reads the classes (or the CUSTOM_ traits) Placement defines into
// made.
func (s *Syncer) list(ctx context.Context, trait bool) error {
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
	return nil
}

// define creates one class or trait and notes it made; created is false
// when Placement had it already.
func (s *Syncer) define(ctx context.Context, name string, trait bool) (created bool, err error) {
	if trait {
		created, err = s.c.DefineTrait(ctx, name)
	} else {
		created, err = s.c.DefineResourceClass(ctx, name)
	}
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	s.made[name] = true
	s.mu.Unlock()
	return created, nil
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
