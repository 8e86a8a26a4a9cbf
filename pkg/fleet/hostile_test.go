package fleet

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/vgpud/vgpud/internal/testenv"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// hostileProxy stands in front of a real Placement and, while mode is
// set, answers as a broken or hostile one would.
type hostileProxy struct {
	mode atomic.Value // string; "" forwards
	rp   *httputil.ReverseProxy
}

func (p *hostileProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	mode, _ := p.mode.Load().(string)
	errBody := func(status int, detail string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"errors": [{"status": %d, "title": %q, "detail": %q}]}`, status, http.StatusText(status), detail)
	}
	switch {
	case mode == "malformed" && r.Method == http.MethodGet:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"resource_providers": [{"uuid": `))
	case mode == "server":
		errBody(http.StatusInternalServerError, "database unavailable")
	case mode == "redirect":
		http.Redirect(w, r, "http://127.0.0.1:1/elsewhere", http.StatusTemporaryRedirect)
	case mode == "huge" && r.Method == http.MethodGet:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"resource_providers": ["`))
		_, _ = w.Write(bytes.Repeat([]byte("x"), placementapi.MaxBody+1024))
		_, _ = w.Write([]byte(`"]}`))
	case mode == "delete-race" && r.Method == http.MethodDelete:
		// Another client deletes the consumer just before this request
		// arrives: Placement answers 404.
		p.rp.ServeHTTP(httptest.NewRecorder(), r.Clone(r.Context()))
		p.rp.ServeHTTP(w, r)
	case mode == "version":
		errBody(http.StatusNotAcceptable, "Unacceptable version header: 1.39")
	default:
		p.rp.ServeHTTP(w, r)
	}
}

func counted(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestHostilePlacement: a Placement answering malformed JSON, HTTP 500, a
// redirect, a huge body or refusing the microversion makes the sync fail
// with that error's kind in the log and in vgpud_fleet_sync_failures_total;
// local creates go on meanwhile, and once Placement answers honestly the
// fleet converges with every instance's allocation: nothing lost.
func TestHostilePlacement(t *testing.T) {
	srv, c := startPlacement(t)
	target, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ErrorLog = log.New(io.Discard, "", 0) // Placement closing early is not the point here
	proxy := &hostileProxy{rp: rp}
	front := httptest.NewServer(proxy)
	defer front.Close()

	a := startHost(t, "hosth", front.URL, nil, Config{Interval: 200 * time.Millisecond})
	logs := &testenv.Buffer{}
	a.s.log = slog.New(slog.NewTextHandler(logs, nil))
	a.run(t)
	converged(t, c, a)

	// An orphan claim the pass removes while its scheduler deletes it too:
	// the pass succeeds.
	t.Run("delete race", func(t *testing.T) {
		a.s.cfg.Grace = time.Millisecond
		defer func() { a.s.cfg.Grace = time.Hour }()
		id := uuid.NewString()
		if err := claim(c, id, GPUProviderUUID(a.s.top(), sim.DefaultL4), map[string]int{"CUSTOM_VGPUD_L4_4Q": 1}); err != nil {
			t.Fatal(err)
		}
		proxy.mode.Store("delete-race")
		defer proxy.mode.Store("")
		for try := 0; ; try++ {
			if err := a.s.Pass(context.Background()); err != nil {
				t.Fatalf("pass racing a scheduler's delete: %v", err)
			}
			if cons, _ := c.Consumer(context.Background(), id); len(cons.Allocations) == 0 {
				break
			}
			if try == 5 {
				t.Fatal("the orphan claim was never removed")
			}
			time.Sleep(5 * time.Millisecond)
		}
	})

	var made []string
	for _, tc := range []struct{ mode, kind string }{
		{"malformed", "malformed"},
		{"server", "server"},
		{"redirect", "redirect"},
		{"huge", "too_large"},
		{"version", "version"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			failures := a.s.met.failures.WithLabelValues(tc.kind)
			before := counted(t, failures)
			proxy.mode.Store(tc.mode)
			// The first create meets the hostile answer in its claim (no
			// pass has failed yet): it goes on without it.
			rec, err := a.h.Manager.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "1g.10gb"})
			if err != nil {
				t.Fatalf("local create whose claim met Placement answering %s: %v", tc.mode, err)
			}
			made = append(made, rec.UUID)
			deadline := time.Now().Add(20 * time.Second)
			for counted(t, failures) == before {
				if time.Now().After(deadline) {
					t.Fatalf("no sync failure of kind %s counted within 20s; log:\n%s", tc.kind, logs.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
			if !strings.Contains(logs.String(), "kind="+tc.kind) {
				t.Fatalf("the log does not name kind %s:\n%s", tc.kind, logs.String())
			}
			// The host keeps serving: local creates do not fail because
			// Placement misbehaves.
			for i := 0; i < 2; i++ {
				rec, err := a.h.Manager.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "1g.10gb"})
				if err != nil {
					t.Fatalf("local create with Placement answering %s: %v", tc.mode, err)
				}
				made = append(made, rec.UUID)
			}
			proxy.mode.Store("")
			converged(t, c, a)
			for _, id := range made {
				if cons, err := c.Consumer(context.Background(), id); err != nil || len(cons.Allocations) != 1 {
					t.Fatalf("allocation of %s after Placement answered %s: %+v, %v", id, tc.mode, cons, err)
				}
			}
			for _, id := range made[len(made)-3:] {
				if err := a.h.Manager.Destroy(context.Background(), id, manager.DestroyOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			made = made[:len(made)-3]
			converged(t, c, a)
		})
	}
}
