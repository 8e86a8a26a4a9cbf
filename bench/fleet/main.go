// Command fleet measures vgpud's Placement sync (docs/fleet.md): three
// simulated hosts publish to one real Placement and 1, 4 and 16 fleet
// schedulers churn through it. Reported per phase: the fraction of
// Placement-accepted claims the hosts refused as stale, slot over-commit
// (Placement holding what a host does not), sync lag from a host change to
// Placement showing it (p50/p99), Placement requests per host operation,
// the requests no candidate was found for while a host would have taken
// them, and the acceptance of the same churn (the same seeds, so each
// scheduler asks the same sequence) through the hosts' local placement
// alone (no Placement), the baseline.
//
// Imports: internal/testenv/placement, internal/testenv/simhost, pkg/fleet, pkg/gpu, pkg/gpu/sim, pkg/manager, pkg/placementapi, pkg/tenant.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/fleet"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
	"github.com/vgpud/vgpud/pkg/tenant"
)

type host struct {
	name string
	h    *simhost.Host
	s    *fleet.Syncer
	c    *placementapi.Client
	top  string
	// local: no Placement, the baseline.
	local bool
}

func (h *host) Name() string { return h.name }

func (h *host) Owns(p string) bool {
	for _, g := range h.h.Manager.Inventory().GPUs {
		if fleet.GPUProviderUUID(h.top, g.PCI) == p {
			return true
		}
	}
	return false
}

func (h *host) Create(ctx context.Context, consumer, profile string) error {
	req := manager.CreateRequest{Tenant: "acme", Profile: profile, PlacementConsumer: consumer}
	if h.local {
		req = manager.CreateRequest{Tenant: "acme", Profile: profile, UUID: consumer}
	}
	_, err := h.h.Manager.Create(ctx, req)
	return err
}

func (h *host) Destroy(ctx context.Context, id string) error {
	return h.h.Manager.Destroy(ctx, id, manager.DestroyOptions{})
}

func specs() []*sim.Spec {
	return []*sim.Spec{
		sim.DefaultSpec(),
		{Version: "v1", GPUs: []sim.GPUSpec{
			{Model: "H100-SXM5-80GB", PCI: "0000:41:00.0", Flavour: gpu.FlavourVFIO, MIG: true},
			{Model: "H100-SXM5-80GB", PCI: "0000:42:00.0", Flavour: gpu.FlavourVFIO, MIG: true},
		}},
		{Version: "v1", GPUs: []sim.GPUSpec{
			{Model: "H100-SXM5-80GB", PCI: "0000:41:00.0", Flavour: gpu.FlavourVFIO, MIG: true},
			{Model: "L4-24GB", PCI: "0000:81:00.0", Flavour: gpu.FlavourVFIO},
			{Model: "L4-24GB", PCI: "0000:82:00.0", Flavour: gpu.FlavourVFIO},
		}},
	}
}

// requests are the churn's profiles from the one flavor table, time-sliced
// types with their framebuffer, as docs/fleet.md advises.
var requests = tplacement.Requests(fleet.ClassName, tplacement.WithFramebuffer, tplacement.ChurnProfiles...)

// Phase is one row of the results.
type Phase struct {
	Schedulers    int     `json:"schedulers"`
	Placed        int64   `json:"placed"`
	StaleRefused  int64   `json:"staleRefused"`
	StaleFraction float64 `json:"staleFraction"`
	ClaimsLost    int64   `json:"claimsLostInPlacement"`
	NoCandidate   int64   `json:"noCandidate"`
	Destroyed     int64   `json:"destroyed"`
	Acceptance    float64 `json:"acceptance"`
	// LocalAcceptance is the same phase through local placement alone.
	LocalAcceptance float64 `json:"localAcceptance"`
	// LostAgainstLocal counts requests with no candidate that a host's
	// admission would have taken when the scheduler gave up (an upper
	// bound with several schedulers: another's claim in flight is not
	// yet on the host).
	LostAgainstLocal  int64   `json:"lostAgainstLocal"`
	OverCommit        int     `json:"overCommit"`
	RequestsPerHostOp float64 `json:"placementRequestsPerHostOp"`
	LagP50Ms          float64 `json:"syncLagP50Ms"`
	LagP99Ms          float64 `json:"syncLagP99Ms"`
}

type result struct {
	Hosts       int     `json:"hosts"`
	OpsPerPhase int     `json:"opsPerPhase"`
	Phases      []Phase `json:"phases"`
	// PhasesWithoutWholeGPU: the same churn without whole-GPU requests
	// (whose flavors ask all of the GPU class: docs/fleet.md), so that
	// what the whole GPUs add to the refusals shows.
	PhasesWithoutWholeGPU []Phase `json:"phasesWithoutWholeGPU"`
	Note                  string  `json:"note"`
}

func main() {
	out := flag.String("out", "bench/fleet.json", "where to write the results")
	ops := flag.Int("ops", 96, "scheduler operations per phase")
	flag.Parse()
	if err := run(*out, *ops); err != nil {
		log.Fatal(err)
	}
}

func run(out string, ops int) error {
	res := result{Hosts: len(specs()), OpsPerPhase: ops,
		Note: "sync lag: a destroy's return to Placement no longer holding its allocation, polled every 2 ms; over-commit: consumers Placement holds on a host's providers that the host does not, or the reverse, after the phase settles; localAcceptance: the same phases, seeds and 20 destroys after each, through the hosts' local placement alone"}
	var err error
	if res.Phases, err = runMix(ops, requests); err != nil {
		return err
	}
	var partial []tplacement.Request
	for _, r := range requests {
		if r.Profile != "passthrough" {
			partial = append(partial, r)
		}
	}
	if res.PhasesWithoutWholeGPU, err = runMix(ops, partial); err != nil {
		return err
	}
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(out, append(data, '\n'), 0o644)
}

// runMix runs the three fleet phases and then the same three through local
// placement alone, on fresh hosts and a fresh Placement.
func runMix(ops int, reqs []tplacement.Request) ([]Phase, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "vgpud-bench-fleet-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	srv, err := tplacement.Open(filepath.Join(dir, "placement"))
	if err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	defer srv.Stop()
	schedC, err := placementapi.New(placementapi.Config{Endpoint: srv.URL()})
	if err != nil {
		return nil, err
	}
	hosts, err := openHosts(ctx, dir, srv.URL(), false)
	if err != nil {
		return nil, err
	}
	var sh []tplacement.Host
	for _, h := range hosts {
		sh = append(sh, h)
		go h.s.Run(ctx)
	}
	var phases []Phase
	for _, workers := range []int{1, 4, 16} {
		p, err := phase(ctx, schedC, hosts, sh, workers, ops, reqs)
		if err != nil {
			return nil, err
		}
		phases = append(phases, p)
		log.Printf("%+v", p)
	}
	cancel()
	lctx := context.Background()
	local, err := openHosts(lctx, filepath.Join(dir, "local"), "", true)
	if err != nil {
		return nil, err
	}
	var lsh []tplacement.Host
	for _, h := range local {
		lsh = append(lsh, h)
	}
	for i, workers := range []int{1, 4, 16} {
		a, err := localPhase(lctx, local, lsh, workers, ops, reqs)
		if err != nil {
			return nil, err
		}
		phases[i].LocalAcceptance = a
		log.Printf("%d schedulers through local placement: acceptance %.3f", workers, a)
	}
	return phases, nil
}

func openHosts(ctx context.Context, dir, url string, local bool) ([]*host, error) {
	var hosts []*host
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i, spec := range specs() {
		name := fmt.Sprintf("bench%d", i)
		h, err := simhost.Open(ctx, simhost.Options{Dir: filepath.Join(dir, name), Spec: spec, Manager: manager.Config{Logger: quiet}})
		if err != nil {
			return nil, err
		}
		if _, err := h.Manager.DefineTenant(ctx, tenant.Tenant{Name: "acme", Quota: tenant.UnlimitedQuota()}); err != nil {
			return nil, err
		}
		hh := &host{name: name, h: h, local: local}
		if !local {
			c, err := placementapi.New(placementapi.Config{Endpoint: url})
			if err != nil {
				return nil, err
			}
			s, err := fleet.New(fleet.Config{Host: name, Grace: time.Hour, Interval: 10 * time.Second}, c, h.Manager, quiet, nil)
			if err != nil {
				return nil, err
			}
			if err := s.Pass(ctx); err != nil {
				return nil, err
			}
			h.Manager.SetFleet(s)
			hh.s, hh.c, hh.top = s, c, fleet.RootUUID(name)
		}
		hosts = append(hosts, hh)
	}
	return hosts, nil
}
