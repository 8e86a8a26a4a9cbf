package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// tokenServer is a Placement stand-in that records the token of each
// request (the version check Apply makes is enough here).
type tokenServer struct {
	mu     sync.Mutex
	tokens []string
}

func (s *tokenServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.tokens = append(s.tokens, r.Header.Get("X-Auth-Token"))
	s.mu.Unlock()
	http.Error(w, "no", http.StatusServiceUnavailable)
}

func (s *tokenServer) saw(tok string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.tokens, tok)
}

// TestFleetTokenFile: the token file is re-read on every Apply (a rotated
// token at the same path reaches Placement), one that cannot be used (gone,
// a FIFO, open to other users) is refused at once by name with the running
// syncer kept, and a FIFO does not hold the reload; so is a fleet.offer
// the catalog refuses.
func TestFleetTokenFile(t *testing.T) {
	ts := &tokenServer{}
	srv := httptest.NewServer(ts)
	t.Cleanup(srv.Close)
	h := simhost.Start(t, simhost.Options{})
	r := NewRunner(RunnerConfig{Host: h.Manager, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(r.Stop)
	ctx := context.Background()
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := func() *Settings {
		return &Settings{Endpoint: srv.URL, TokenFile: tok, Host: "hosta", SyncInterval: time.Hour}
	}
	if err := r.Apply(ctx, cfg()); err != nil || !ts.saw("first") {
		t.Fatalf("apply = %v; Placement saw %v", err, ts.tokens)
	}
	// Rotated in place: the same settings, a new token.
	if err := os.WriteFile(tok, []byte("second\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Apply(ctx, cfg()); err != nil || !ts.saw("second") || r.token != "second" {
		t.Fatalf("apply after rotation = %v; Placement saw %v", err, ts.tokens)
	}
	running := r.syncer
	kept := func(what string, err error, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Fatalf("%s: apply = %v, want %v", what, err, want)
		}
		if r.syncer != running || r.cancel == nil || r.token != "second" {
			t.Fatalf("%s: the running syncer was not kept", what)
		}
	}
	for _, mode := range []os.FileMode{0o644, 0o602, 0o666} {
		if err := os.Chmod(tok, mode); err != nil {
			t.Fatal(err)
		}
		err := r.Apply(ctx, cfg())
		kept(fmt.Sprintf("mode %04o", mode), err, errTokenFileMode)
		if !strings.Contains(err.Error(), "chmod 600") {
			t.Fatalf("mode %04o: %v does not say which mode to set", mode, err)
		}
	}
	if err := os.Remove(tok); err != nil {
		t.Fatal(err)
	}
	kept("gone", r.Apply(ctx, cfg()), fs.ErrNotExist)
	if err := syscall.Mkfifo(tok, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Apply(ctx, cfg()) }()
	select {
	case err := <-done:
		kept("fifo", err, errTokenFileKind)
	case <-time.After(20 * time.Second):
		t.Fatal("apply with a FIFO as token file did not return")
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, maxTokenFile+1), 0o600); err != nil {
		t.Fatal(err)
	}
	c := cfg()
	c.TokenFile = big
	kept("too large", r.Apply(ctx, c), errTokenFileSize)
	if err := os.Remove(tok); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tok, []byte("second\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c = cfg()
	c.Offer = map[string][]string{"L4-24GB": {"3g.40gb"}}
	kept("an offer the catalog refuses", r.Apply(ctx, c), manager.ErrInvalidArgument)
}

// TestFleetHostChangeRetiresOldTree: a reload that moves the host to
// another provider tree (fleet.host changed) is refused while the host
// has instances, the running sync kept; with none, the old tree is removed
// from Placement before the new one is published, so one host never
// advertises two trees.
func TestFleetHostChangeRetiresOldTree(t *testing.T) {
	srv := tplacement.Start(t)
	c, err := placementapi.New(placementapi.Config{Endpoint: srv.URL(), Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h := simhost.Start(t, simhost.Options{})
	simhost.DefineTenant(t, h.Manager, "acme")
	r := NewRunner(RunnerConfig{Host: h.Manager, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(r.Stop)
	ctx := context.Background()
	cfg := func(host string) *Settings {
		return &Settings{Endpoint: srv.URL(), Host: host, SyncInterval: time.Hour}
	}
	treeOf := func(host string) int {
		tree, err := c.Tree(ctx, RootUUID(host))
		if err != nil {
			return -1
		}
		return len(tree)
	}
	if err := r.Apply(ctx, cfg("old-host")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the old host's tree published", 30*time.Second, func() bool { return treeOf("old-host") == 5 })
	inst := simhost.MustCreate(t, h.Manager, "acme", "L4-4Q", sim.DefaultL4)
	running := r.syncer
	if err := r.Apply(ctx, cfg("new-host")); !errors.Is(err, errTreeInUse) || r.syncer != running || r.cancel == nil {
		t.Fatalf("host change with an instance = %v (syncer kept: %v)", err, r.syncer == running)
	}
	if err := h.Manager.Destroy(ctx, inst.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := r.Apply(ctx, cfg("new-host")); err != nil {
		t.Fatal(err)
	}
	if n := treeOf("old-host"); n != 0 {
		t.Fatalf("the old tree holds %d providers after the host changed", n)
	}
	testenv.WaitFor(t, "the new host's tree published", 30*time.Second, func() bool { return treeOf("new-host") == 5 })
}

// TestRetireTakesProvidersCutBeforeTheirTraits: a pass cut between
// creating a GPU's provider and writing its traits (a reload, a stop, a
// crash) leaves a provider without CUSTOM_VGPUD_MANAGED under vgpud's
// root; it is still vgpud's (its UUID is the one vgpud derives from the
// root and its PCI address), so retiring the tree removes it, and the root
// with it. A provider of another name under the root is not vgpud's.
func TestRetireTakesProvidersCutBeforeTheirTraits(t *testing.T) {
	srv, c := startPlacement(t)
	a := startHost(t, "hostr", srv.URL(), nil, Config{})
	a.pass(t)
	ctx := context.Background()
	const pci = "0000:99:00.0"
	if err := c.CreateProvider(ctx, GPUProviderUUID(a.s.top(), pci), GPUProviderName("hostr", pci), a.s.top()); err != nil {
		t.Fatal(err)
	}
	if st, err := a.s.Status(ctx); err != nil || !strings.Contains(fmt.Sprint(st.Differences), GPUProviderName("hostr", pci)) {
		t.Fatalf("fleet status differences %v (%v): want the traitless provider named stale", st.Differences, err)
	}
	if err := a.s.Retire(ctx); err != nil {
		t.Fatalf("retire with a provider cut before its traits: %v", err)
	}
	if tree, err := c.Tree(ctx, a.s.top()); err != nil || len(tree) != 0 {
		t.Fatalf("after retiring, the tree holds %d providers (%v)", len(tree), err)
	}
}
