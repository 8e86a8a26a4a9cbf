package fleet

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// recorder stands between one syncer and Placement and notes each
// request as "METHOD /path" (the query left out).
type recorder struct {
	url string
	mu  sync.Mutex
	log []string
}

func startRecorder(t *testing.T, target string) *recorder {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.log = append(r.log, req.Method+" "+req.URL.Path)
		r.mu.Unlock()
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

// take returns the requests noted since the last take.
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.log
	r.log = nil
	return out
}

// count is how many of reqs start with prefix ("PUT /resource_classes/").
func count(reqs []string, prefix string) int {
	n := 0
	for _, r := range reqs {
		if strings.HasPrefix(r, prefix) {
			n++
		}
	}
	return n
}

// recordedHost is a host whose syncer talks to Placement through a recorder.
func recordedHost(t *testing.T, name, url string) (*host, *recorder) {
	t.Helper()
	rec := startRecorder(t, url)
	return startHost(t, name, rec.url, nil, Config{}), rec
}

// A host's first publish lists the classes and traits Placement defines
// and creates only those missing: the second host of a fleet creates
// none, and a provider it has just made is written, not read.
func TestFirstPublishCreatesOnlyMissingNames(t *testing.T) {
	srv, _ := startPlacement(t)
	a, ra := recordedHost(t, "hosta", srv.URL())
	a.pass(t)
	first := ra.take()
	if n := count(first, "PUT /resource_classes/"); n == 0 {
		t.Fatalf("the first host created no class: %v", first)
	}
	if n := count(first, "GET /resource_classes"); n != 1 {
		t.Fatalf("the first host listed the classes %d times, want once: %v", n, first)
	}
	b, rb := recordedHost(t, "hostb", srv.URL())
	b.pass(t)
	second := rb.take()
	if n := count(second, "PUT /resource_classes/") + count(second, "PUT /traits/"); n != 0 {
		t.Fatalf("the second host created %d classes or traits the first had made: %v", n, second)
	}
	if n := count(second, "GET /resource_classes") + count(second, "GET /traits"); n != 2 {
		t.Fatalf("the second host listed %d times, want classes and traits once each: %v", n, second)
	}
	// Four GPUs made: each is created, its inventories and traits written
	// without a read before them.
	for _, read := range []string{"/inventories", "/traits", "/allocations"} {
		for _, r := range second {
			if strings.HasPrefix(r, "GET /resource_providers/") && strings.HasSuffix(r, read) {
				t.Fatalf("a provider just made was read (%s): %v", r, second)
			}
		}
	}
	if len(second) > 20 {
		t.Fatalf("the second host's first publish took %d requests: %v", len(second), second)
	}
}

// A pass with nothing to change reads the tree and, of the GPU providers,
// only the allocations of those that hold some: one that held none at the
// generation it still has cannot hold any now.
func TestIdlePassReadsOnlyTheTree(t *testing.T) {
	srv, c := startPlacement(t)
	a, ra := recordedHost(t, "hosta", srv.URL())
	ctx := context.Background()
	a.pass(t)
	a.pass(t) // the first pass's own writes moved the generations
	ra.take()
	a.pass(t)
	if idle := ra.take(); len(idle) != 1 || !strings.HasPrefix(idle[0], "GET /resource_providers") {
		t.Fatalf("an idle pass of an empty host made %d requests, want the tree alone: %v", len(idle), idle)
	}
	// A claim someone else writes bumps the provider's generation: the
	// next pass reads that provider's allocations (and keeps the claim
	// through its grace).
	mig := GPUProviderUUID(a.s.top(), sim.DefaultH100MIG)
	stray := uuid.NewString()
	if err := claim(c, stray, mig, map[string]int{"CUSTOM_VGPUD_MIG_1G_10GB": 1, SliceClass: 1}); err != nil {
		t.Fatal(err)
	}
	a.pass(t)
	if got := ra.take(); count(got, "GET /resource_providers/"+mig+"/allocations") == 0 {
		t.Fatalf("the pass after a claim did not read its provider's allocations: %v", got)
	}
	// Its deletion bumps no generation: a provider that held something is
	// read on every pass.
	if err := c.PutConsumer(ctx, stray, placementapi.Consumer{}); err != nil {
		t.Fatal(err)
	}
	a.pass(t)
	if got := ra.take(); count(got, "GET /resource_providers/"+mig+"/allocations") == 0 {
		t.Fatalf("the pass after a deletion did not read the allocations: %v", got)
	}
	if st, err := a.s.Status(ctx); err != nil || len(st.Differences) != 0 {
		t.Fatalf("status: %+v, %v", st.Differences, err)
	}
}
