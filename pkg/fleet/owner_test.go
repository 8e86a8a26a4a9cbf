package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// novaClaim writes an allocation as Nova's scheduler report client does:
// microversion 1.36, no consumer_type (Placement records "unknown"), the
// instance's project and user.
func novaClaim(t *testing.T, url, consumer, provider string, res map[string]int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"allocations":         map[string]any{provider: map[string]any{"resources": res}},
		"consumer_generation": nil, "project_id": "nova-project", "user_id": "nova-user"})
	req, err := http.NewRequest(http.MethodPut, url+"/allocations/"+consumer, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("OpenStack-API-Version", "placement 1.36")
	req.Header.Set("X-Auth-Token", "admin")
	req.Header.Set("Content-Type", "application/json")
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT /allocations at 1.36: %s", resp.Status)
	}
}

// TestStatusShowsSchedulersConsumer: an allocation Nova wrote at 1.36
// (consumer_type unknown, Nova's project and user) shows in fleet status
// with its project, user and type while its create has not come, is
// adopted by the create, and keeps Nova's project and user.
func TestStatusShowsSchedulersConsumer(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	a := startHost(t, "hosta", srv.URL(), nil, Config{})
	a.pass(t)
	id := uuid.NewString()
	novaClaim(t, srv.URL(), id, GPUProviderUUID(a.s.top(), sim.DefaultL4),
		map[string]int{ClassName(store.KindVGPU, "L4-4Q"): 1, FramebufferClass: 4096})
	st, err := a.s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, d := range st.Differences {
		if d.Kind == DiffAllocationStale && d.Subject == id {
			found = true
			if !strings.Contains(d.Placement, "project nova-project, user nova-user, consumer_type unknown") {
				t.Fatalf("the scheduler's claim shows as %q; want its project, user and type", d.Placement)
			}
		}
	}
	if !found {
		t.Fatalf("no allocation-stale for the claim in %+v", st.Differences)
	}
	if _, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "L4-4Q", PlacementConsumer: id}); err != nil {
		t.Fatalf("adopting Nova's allocation: %v", err)
	}
	converged(t, c, a)
	cons, err := c.Consumer(ctx, id)
	if err != nil || cons.ProjectID != "nova-project" || cons.UserID != "nova-user" {
		t.Fatalf("consumer after the create: %+v, %v; want Nova's project and user kept", cons, err)
	}
}
