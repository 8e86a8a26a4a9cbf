package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/internal/testenv"
	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// host is one simulated host with its syncer, publishing to a shared Placement.
type host struct {
	name string
	h    *simhost.Host
	s    *Syncer
}

func newClient(t testing.TB, url string) *placementapi.Client {
	t.Helper()
	c, err := placementapi.New(placementapi.Config{Endpoint: url, Timeout: 3 * time.Second, Backoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func quietLog(t testing.TB) *slog.Logger {
	if os.Getenv("VGPUD_TEST_VERBOSE") != "" {
		return testenv.Logger(t)
	}
	return slog.New(slog.NewTextHandler(ioDiscard{}, nil))
}

type ioDiscard struct{}

func (ioDiscard) Write(p []byte) (int, error) { return len(p), nil }

func startHost(t testing.TB, name, url string, spec *sim.Spec, cfg Config) *host {
	t.Helper()
	h := simhost.Start(t, simhost.Options{Spec: spec})
	simhost.DefineTenant(t, h.Manager, "acme")
	cfg.Host = name
	if cfg.Grace == 0 {
		cfg.Grace = time.Hour
	}
	// The product's defaults (a 2 s claim, a 1 s settle) are for a
	// Placement that answers in milliseconds; on a loaded test machine
	// Placement may take seconds, and a test about what a claim or a
	// settle decides must not see its deadline instead. Tests of the
	// deadlines set them.
	if cfg.ClaimTimeout == 0 {
		cfg.ClaimTimeout = 15 * time.Second
	}
	if cfg.SettleTimeout == 0 {
		cfg.SettleTimeout = 10 * time.Second
	}
	s, err := New(cfg, newClient(t, url), h.Manager, quietLog(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	h.Manager.SetFleet(s)
	return &host{name: name, h: h, s: s}
}

// run runs the syncer's loop (passes after host events, which also mark
// destroyed instances' allocations for removal) until the test ends.
func (h *host) run(t testing.TB) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func (h *host) pass(t testing.TB) {
	t.Helper()
	if err := h.s.Pass(context.Background()); err != nil {
		t.Fatalf("%s: pass: %v", h.name, err)
	}
}

// truth is the allocations the host's records say Placement must hold:
// consumer → provider → resources.
func (h *host) truth(t testing.TB) map[string]map[string]map[string]int {
	t.Helper()
	view, err := h.h.Manager.FleetView()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]map[string]int{}
	for _, p := range desiredIn(h.name, h.s.top(), view, h.s.shapes, h.s.cfg.Inventories, h.s.carves) {
		for c, r := range p.allocs {
			out[c] = map[string]map[string]int{p.uuid: r}
		}
	}
	return out
}

// placementHolds is what Placement holds on h's providers, in truth's shape,
// and how each provider's inventories differ from the host's ("" when none):
// a difference is retried by converged, since a pass that met a transient
// Placement error leaves the next pass to finish.
func (h *host) placementHolds(t testing.TB, c *placementapi.Client) (map[string]map[string]map[string]int, string) {
	t.Helper()
	ctx := context.Background()
	view, err := h.h.Manager.FleetView()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]map[string]int{}
	var diff string
	for _, p := range desiredIn(h.name, h.s.top(), view, h.s.shapes, h.s.cfg.Inventories, h.s.carves) {
		inv, _, err := c.Inventories(ctx, p.uuid)
		if err != nil { // e.g. not there yet after a wipe: the next try
			diff += fmt.Sprintf("%s: inventories of %s: %v\n", h.name, p.name, err)
			continue
		}
		if !sameInventories(inv, p.inv) {
			diff += fmt.Sprintf("%s: %s inventories differ:\nplacement %v\nhost      %v\n", h.name, p.name, inv, p.inv)
		}
		allocs, err := c.ProviderAllocations(ctx, p.uuid)
		if err != nil {
			diff += fmt.Sprintf("%s: allocations on %s: %v\n", h.name, p.name, err)
			continue
		}
		for cons, r := range allocs {
			if out[cons] == nil {
				out[cons] = map[string]map[string]int{}
			}
			out[cons][p.uuid] = r
		}
	}
	return out, diff
}

func sameHolding(a, b map[string]map[string]map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for c, ps := range a {
		if len(ps) != len(b[c]) {
			return false
		}
		for p, r := range ps {
			if !sameResources(r, b[c][p]) {
				return false
			}
		}
	}
	return true
}

// converged checks Placement equals the union of the hosts' truth once
// the hosts' events have been taken in (a few passes at most).
func converged(t testing.TB, c *placementapi.Client, hosts ...*host) {
	t.Helper()
	var msg string
	for try := 0; try < 10; try++ {
		msg = ""
		for _, h := range hosts {
			// A pass may fail on a transient Placement error (sqlite's
			// "database is locked" answered as 500 while the three syncers
			// and the test write at once): the next try passes again.
			if err := h.s.Pass(context.Background()); err != nil {
				msg += fmt.Sprintf("%s: pass: %v\n", h.name, err)
			}
		}
		for _, h := range hosts {
			want := h.truth(t)
			got, diff := h.placementHolds(t, c)
			msg += diff
			if !sameHolding(want, got) {
				msg += fmt.Sprintf("%s: Placement holds %d consumers, the host %d:\nplacement %v\nhost      %v\n", h.name, len(got), len(want), keys(got), keys(want))
			}
		}
		if msg == "" {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal(msg)
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func startPlacement(t testing.TB) (*tplacement.Server, *placementapi.Client) {
	t.Helper()
	srv := tplacement.Start(t)
	return srv, newClient(t, srv.URL())
}

var _ = manager.ErrNoCapacity

// schedulerClaims does what a fleet scheduler does for one request group:
// asks Placement for candidates of resources and claims the first under a
// new consumer, which it returns.
func schedulerClaims(t testing.TB, c *placementapi.Client, resources string) string {
	t.Helper()
	ctx := context.Background()
	q := url.Values{"resources1": {resources}, "limit": {"5"}}
	cands, err := c.AllocationCandidates(ctx, q.Encode())
	if err != nil || len(cands) == 0 {
		t.Fatalf("candidates of %s = %v, %v", resources, cands, err)
	}
	id := uuid.NewString()
	if err := c.PutConsumer(ctx, id, placementapi.Consumer{Allocations: cands[0].Allocations, ProjectID: "p", UserID: "u", ConsumerType: "INSTANCE"}); err != nil {
		t.Fatal(err)
	}
	return id
}
