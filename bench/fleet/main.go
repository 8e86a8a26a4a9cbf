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
// Per phase also: the stale refusals by cause, and the room the hosts had
// for the churn's profiles beside what Placement offered of it, with each
// way of publishing MIG totals (fleet.inventories: carvable, exact).
//
// Imports: internal/testenv/placement, internal/testenv/simhost, pkg/fleet, pkg/gpu, pkg/gpu/sim, pkg/manager, pkg/placement, pkg/placementapi, pkg/store, pkg/tenant.
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
	LostAgainstLocal int64 `json:"lostAgainstLocal"`
	OverCommit       int   `json:"overCommit"`
	// StaleByCause counts StaleRefused by the host's reason (causes.add).
	StaleByCause map[string]int64 `json:"staleByCause"`
	// StaleSamples are the phase's first stale refusals, cause and message.
	StaleSamples []string `json:"staleSamples,omitempty"`
	// RoomsExact is the room the hosts' own engine had for the churn's
	// profiles (each counted alone, summed over GPUs), RoomsOffered what
	// Placement offered of it with the phase's inventories, both averaged
	// over samples every 250 ms of the churn; RoomsNotOffered the
	// fraction of the first the second lacks (the carvable inventories'
	// cost; 0 with exact ones).
	RoomsExact        float64 `json:"roomsExact"`
	RoomsOffered      float64 `json:"roomsOffered"`
	RoomsNotOffered   float64 `json:"roomsNotOffered"`
	RequestsPerHostOp float64 `json:"placementRequestsPerHostOp"`
	LagP50Ms          float64 `json:"syncLagP50Ms"`
	LagP99Ms          float64 `json:"syncLagP99Ms"`
}

type result struct {
	Hosts       int `json:"hosts"`
	OpsPerPhase int `json:"opsPerPhase"`
	// Modes: the same phases with each way of publishing MIG totals
	// (fleet.inventories), the default first.
	Modes []modeResult `json:"modes"`
	Note  string       `json:"note"`
}

type modeResult struct {
	Inventories string  `json:"inventories"`
	Phases      []Phase `json:"phases"`
	// PhasesWithoutWholeGPU: the same churn without whole-GPU requests
	// (whose flavors ask all of the GPU class: docs/fleet.md), so that
	// what the whole GPUs add to the refusals shows.
	PhasesWithoutWholeGPU []Phase `json:"phasesWithoutWholeGPU"`
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
		Note: "sync lag: a destroy's return to Placement no longer holding its allocation, polled every 2 ms; over-commit: consumers Placement holds on a host's providers that the host does not, or the reverse, after the phase settles; localAcceptance: the same phases, seeds and 20 destroys after each, through the hosts' local placement alone; staleByCause: alignment (free slices, no aligned start), migLimit (no free slices or the profile's per-GPU limit), timeSliced, wholeGPU, allocationGone, other; roomsExact/roomsOffered: the hosts' room for the churn's profiles and what Placement offered of it, sampled every 250 ms"}
	var partial []tplacement.Request
	for _, r := range requests {
		if r.Profile != "passthrough" {
			partial = append(partial, r)
		}
	}
	for _, mode := range []string{fleet.InventoriesCarvable, fleet.InventoriesExact} {
		m := modeResult{Inventories: mode}
		var err error
		if m.Phases, err = runMix(ops, requests, mode); err != nil {
			return err
		}
		if m.PhasesWithoutWholeGPU, err = runMix(ops, partial, mode); err != nil {
			return err
		}
		res.Modes = append(res.Modes, m)
	}
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(out, append(data, '\n'), 0o644)
}

// runMix runs the three fleet phases and then the same three through local
// placement alone, on fresh hosts and a fresh Placement.
func runMix(ops int, reqs []tplacement.Request, mode string) ([]Phase, error) {
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
	hosts, err := openHosts(ctx, dir, srv.URL(), false, mode)
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
		p, err := phase(ctx, schedC, hosts, sh, workers, ops, reqs, mode)
		if err != nil {
			return nil, err
		}
		phases = append(phases, p)
		log.Printf("%s: %+v", mode, p)
	}
	cancel()
	lctx := context.Background()
	local, err := openHosts(lctx, filepath.Join(dir, "local"), "", true, mode)
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

func openHosts(ctx context.Context, dir, url string, local bool, mode string) ([]*host, error) {
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
			s, err := fleet.New(fleet.Config{Host: name, Grace: time.Hour, Interval: 10 * time.Second, Inventories: mode}, c, h.Manager, quiet, nil)
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
