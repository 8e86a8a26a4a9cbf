package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
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

// maxRelists bounds the lists one ensureList reads again (relisting).
const maxRelists = 3

// ensureList is ensureNames for classes or for traits. A name Placement
// answers it had already (204, not 201) means another writer is defining
// them now (every host of a fleet after Placement lost its database): the
// list is read again (up to maxRelists times) and only what is still
// missing is created, instead of every host creating every name. Each
// host creates the missing names in an order of its own: hosts in the
// same order would each find one name made, list, and find only the next
// made, in step; in different orders, what one host lists after its
// first 204 holds what all the others made meanwhile (at 100 hosts after
// a wiped database, 20 classes created per host in step).
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
	rand.Shuffle(len(missing), func(i, j int) { missing[i], missing[j] = missing[j], missing[i] })
	relists := 0
	for i := 0; i < len(missing); i++ {
		n := missing[i]
		if s.unmade([]string{n}) == nil {
			continue
		}
		created, err := s.define(ctx, n, trait)
		if err != nil {
			return fmt.Errorf("define %s: %w", n, err)
		}
		if !created && relists < maxRelists && i+1 < len(missing) {
			relists++
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
