package main

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/pkg/fleet"
	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/store"
)

// causes counts the stale refusals of one phase by cause.
type causes struct {
	mu sync.Mutex
	n  map[string]int64
	// samples are the first refusals' profiles and messages.
	samples []string
}

// add classifies a host's refusal of a claim Placement accepted:
// alignment (the GPU's free slices hold no aligned start for the
// profile), migLimit (no free slices, or the profile's per-GPU limit: a
// mix of profiles Placement counted apart), timeSliced (a time-sliced
// GPU's type lock or framebuffer), wholeGPU (any refusal of a whole GPU's
// create, or of one on a GPU given whole), allocationGone (the claim went
// while the create ran), other (among them a Placement read that did not
// answer). The first messages (samples) tell a refusal the host could not
// carve from one where Placement did not answer in time.
func (c *causes) add(r tplacement.Request, err error) {
	kind := tplacement.FlavorOf(r.Profile).Kind
	cause := "other"
	switch {
	case kind == store.KindPassthrough || strings.Contains(err.Error(), "passed through"):
		cause = "wholeGPU"
	case errors.Is(err, placement.ErrFragmented):
		cause = "alignment"
	case errors.Is(err, placement.ErrNoCapacity) && (kind == store.KindMIG || kind == store.KindMIGVGPU):
		cause = "migLimit"
	case errors.Is(err, placement.ErrNoCapacity) && kind == store.KindVGPU:
		cause = "timeSliced"
	case strings.Contains(err.Error(), "went while the create ran"):
		cause = "allocationGone"
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int64{}
	}
	c.n[cause]++
	if len(c.samples) < 3 {
		msg := err.Error()
		if len(msg) > 240 {
			msg = msg[:240] + "…"
		}
		c.samples = append(c.samples, cause+": "+msg)
	}
}

func (c *causes) counts() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int64{}
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// rooms samples, while a phase runs, the room the hosts have for the
// churn's profiles (their own engine's, what a local create could take)
// and what Placement offers of it with the inventories of mode, each
// profile counted alone on each GPU.
type rooms struct {
	exact, offered int64
	samples        int64
}

func (r *rooms) sample(hosts []*host, reqs []tplacement.Request, mode string) {
	for _, h := range hosts {
		view, err := h.h.Manager.FleetView()
		if err != nil {
			continue
		}
		for _, g := range view {
			ex, off := fleet.Offered(g, fleet.InventoriesExact), fleet.Offered(g, mode)
			for _, q := range reqs {
				r.exact += int64(ex[q.Profile])
				r.offered += int64(off[q.Profile])
			}
		}
	}
	r.samples++
}

// run samples every period until ctx ends.
func (r *rooms) run(ctx context.Context, hosts []*host, reqs []tplacement.Request, mode string, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.sample(hosts, reqs, mode)
		}
	}
}
