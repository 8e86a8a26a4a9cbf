package placement

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync"
	"sync/atomic"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/placementapi"
)

// Host is one vgpud host as a fleet scheduler sees it.
type Host interface {
	Name() string
	// Owns reports whether a resource provider is one of the host's GPUs.
	Owns(provider string) bool
	// Create asks the host to carve profile for the scheduler's consumer.
	Create(ctx context.Context, consumer, profile string) error
	Destroy(ctx context.Context, instance string) error
}

// Request is one profile and the resources a scheduler asks Placement for
// (one granular group, so they come from one GPU provider).
type Request struct {
	Profile   string
	Resources string // CUSTOM_VGPUD_MIG_3G_40GB:1,CUSTOM_VGPUD_MIG_SLICE:4
}

// Scheduler is a fleet scheduler as Nova's works: allocation candidates,
// a claim (the allocation), the create on the chosen host, and on refusal
// the claim deleted and the next candidate tried.
type Scheduler struct {
	C     *placementapi.Client
	Hosts []Host
	// Local schedules without Placement, the baseline a fleet is compared
	// with: each request tries the hosts in random order (Host.Create with
	// a fresh UUID) until one takes it.
	Local bool
	// OnFull, when set, is told of each request Churn could not place.
	OnFull func(Request)
	// OnStale, when set, is told of each claim a host refused (a stale
	// claim) and the host's error.
	OnStale func(Request, error)
	// Counters.
	Placed, NoCandidate, ClaimLost, Stale, Failed, Destroyed atomic.Int64
}

// ErrFull is no candidate left.
var ErrFull = errors.New("no allocation candidate")

// Place schedules one instance and returns its consumer and host.
func (s *Scheduler) Place(ctx context.Context, r Request, rnd *rand.Rand) (string, Host, error) {
	if s.Local {
		return s.placeLocal(ctx, r, rnd)
	}
	q := url.Values{"resources1": {r.Resources}, "limit": {"20"}}
	cands, err := s.C.AllocationCandidates(ctx, q.Encode())
	if err != nil {
		return "", nil, err
	}
	// Spread schedulers over the candidates as Nova's host subset does.
	rnd.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
	for _, cand := range cands {
		h := s.hostOf(cand)
		if h == nil {
			continue
		}
		consumer := uuid.NewString()
		err := Claim(ctx, s.C, consumer, cand.Allocations)
		if errors.Is(err, placementapi.ErrCapacity) || errors.Is(err, placementapi.ErrConflict) {
			s.ClaimLost.Add(1) // another scheduler won it in Placement
			continue
		}
		if err != nil {
			return "", nil, err
		}
		if err := h.Create(ctx, consumer, r.Profile); err != nil {
			s.Stale.Add(1)
			if s.OnStale != nil {
				s.OnStale(r, err)
			}
			// The host may have removed it already (a create that failed
			// after its admission drops the claim): gone is fine.
			if derr := s.C.PutConsumer(ctx, consumer, placementapi.Consumer{}); derr != nil && !errors.Is(derr, placementapi.ErrNotFound) {
				return "", nil, fmt.Errorf("delete a refused claim: %w", derr)
			}
			continue
		}
		s.Placed.Add(1)
		return consumer, h, nil
	}
	s.NoCandidate.Add(1)
	return "", nil, ErrFull
}

// Claim writes a scheduler's claim: allocs for a new consumer. A claim
// that landed although its answer was lost (a slow Placement; the client's
// retry of it then conflicts with it) is made, this scheduler's and not
// another's: nil, as if the answer had come.
func Claim(ctx context.Context, c *placementapi.Client, consumer string, allocs map[string]placementapi.Allocation) error {
	err := c.PutConsumer(ctx, consumer, placementapi.Consumer{Allocations: allocs,
		ProjectID: "fleet", UserID: "scheduler", ConsumerType: "INSTANCE"})
	if k := placementapi.Kind(err); k == "unreachable" || k == "conflict" {
		if cons, cerr := c.Consumer(ctx, consumer); cerr == nil && len(cons.Allocations) > 0 {
			return nil
		}
	}
	return err
}

func (s *Scheduler) placeLocal(ctx context.Context, r Request, rnd *rand.Rand) (string, Host, error) {
	for _, k := range rnd.Perm(len(s.Hosts)) {
		consumer := uuid.NewString()
		if err := s.Hosts[k].Create(ctx, consumer, r.Profile); err == nil {
			s.Placed.Add(1)
			return consumer, s.Hosts[k], nil
		}
	}
	s.NoCandidate.Add(1)
	return "", nil, ErrFull
}

func (s *Scheduler) hostOf(c placementapi.Candidate) Host {
	for p := range c.Allocations {
		for _, h := range s.Hosts {
			if h.Owns(p) {
				return h
			}
		}
	}
	return nil
}

// Churn runs workers schedulers for ops operations in all: creates of
// random requests (while the fleet has room) and destroys of what they
// made. It returns the first unexpected error.
func (s *Scheduler) Churn(ctx context.Context, workers, ops int, reqs []Request, seed uint64) error {
	var mu sync.Mutex
	type live struct {
		id string
		h  Host
	}
	var alive []live
	var errOnce error
	var wg sync.WaitGroup
	per := ops / workers
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			// Two sources: what each worker asks does not depend on how
			// its candidates were shuffled, so a fleet and a local run of
			// one seed ask the same.
			rnd := rand.New(rand.NewPCG(seed, uint64(w)))
			shuffle := rand.New(rand.NewPCG(seed, uint64(w)+1<<32))
			for i := 0; i < per; i++ {
				mu.Lock()
				n := len(alive)
				mu.Unlock()
				if n == 0 || rnd.Float64() < 0.65 {
					r := reqs[rnd.IntN(len(reqs))]
					id, h, err := s.Place(ctx, r, shuffle)
					if errors.Is(err, ErrFull) {
						if s.OnFull != nil {
							s.OnFull(r)
						}
						continue
					}
					if err != nil {
						s.Failed.Add(1)
						mu.Lock()
						errOnce = errors.Join(errOnce, err)
						mu.Unlock()
						continue
					}
					mu.Lock()
					alive = append(alive, live{id, h})
					mu.Unlock()
					continue
				}
				mu.Lock()
				k := rnd.IntN(len(alive))
				v := alive[k]
				alive[k] = alive[len(alive)-1]
				alive = alive[:len(alive)-1]
				mu.Unlock()
				s.Destroyed.Add(1)
				if err := v.h.Destroy(ctx, v.id); err != nil {
					s.Failed.Add(1)
					mu.Lock()
					errOnce = errors.Join(errOnce, fmt.Errorf("destroy %s on %s: %w", v.id, v.h.Name(), err))
					mu.Unlock()
				}
			}
		}(w)
	}
	wg.Wait()
	return errOnce
}
