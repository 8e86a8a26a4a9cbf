package placementapi

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func serve(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := New(Config{Endpoint: srv.URL, Timeout: 2 * time.Second, Backoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewRefusesBadEndpoints(t *testing.T) {
	for _, ep := range []string{"", "placement:8778", "ftp://x", "http://"} {
		if _, err := New(Config{Endpoint: ep}); !errors.Is(err, ErrBadRequest) {
			t.Errorf("New(%q) = %v, want ErrBadRequest", ep, err)
		}
	}
}

// TestNewRefusesCredentialsAndBadPorts: a password in the URL is refused
// (it would be shown in fleet status and the log) without being echoed,
// and so is a port outside 1-65535.
func TestNewRefusesCredentialsAndBadPorts(t *testing.T) {
	for _, ep := range []string{"http://admin:s3cret@placement:8778", "http://s3cret@placement:8778/x", "http://u:s3cret@placement:99999", "http://u:s3cret@[::1"} {
		_, err := New(Config{Endpoint: ep})
		if !errors.Is(err, ErrBadRequest) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("New(%q) = %v, want ErrBadRequest without the password", ep, err)
		}
	}
	for _, ep := range []string{"http://placement:99999", "http://placement:0", "https://placement:65536/"} {
		if _, err := New(Config{Endpoint: ep}); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "port") {
			t.Errorf("New(%q) = %v, want ErrBadRequest naming the port", ep, err)
		}
	}
	for _, ep := range []string{"http://placement:8778", "https://placement", "http://[::1]:65535/placement"} {
		if _, err := New(Config{Endpoint: ep}); err != nil {
			t.Errorf("New(%q) = %v", ep, err)
		}
	}
}

// TestHeaders: every request names the microversion and the token.
func TestHeaders(t *testing.T) {
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("OpenStack-API-Version") != "placement "+Version || r.Header.Get("X-Auth-Token") != "admin" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.Write([]byte(`{"versions":[{"id":"v1.0","max_version":"1.39","min_version":"1.0"}]}`))
	})
	v, err := c.CheckVersion(context.Background())
	if err != nil || v != "1.39" {
		t.Fatalf("CheckVersion = %q, %v", v, err)
	}
}

func TestBadAnswersAreNamed(t *testing.T) {
	huge := strings.Repeat("x", MaxBody+10)
	cases := []struct {
		name string
		h    http.HandlerFunc
		want error
	}{
		{"malformed JSON", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"resource_providers": [`)) }, ErrMalformed},
		{"server error", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }, ErrServer},
		{"redirect", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://elsewhere.example/", http.StatusFound)
		}, ErrRedirect},
		{"huge body", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(huge)) }, ErrTooLarge},
		{"unknown microversion", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNotAcceptable)
			w.Write([]byte(`{"errors":[{"status":406,"code":"placement.undefined_code","detail":"Unacceptable version header: 1.39"}]}`))
		}, ErrVersion},
		{"generation conflict", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusConflict)
			w.Write([]byte(`{"errors":[{"status":409,"code":"placement.concurrent_update","detail":"generation changed"}]}`))
		}, ErrConflict},
		{"capacity", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusConflict)
			w.Write([]byte(`{"errors":[{"status":409,"code":"placement.undefined_code","detail":"Unable to allocate"}]}`))
		}, ErrCapacity},
		{"not found", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(404) }, ErrNotFound},
		{"auth", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(401) }, ErrAuth},
		{"provider without UUID", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"resource_providers":[{"name":"x"}]}`))
		}, ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := serve(t, tc.h)
			_, err := c.Tree(context.Background(), "4f0b8f7e-2f55-4c1e-9a52-7d1b0c9e6a3d")
			if !errors.Is(err, tc.want) {
				t.Fatalf("Tree = %v, want %v", err, tc.want)
			}
			if Kind(err) == "other" {
				t.Fatalf("Kind(%v) = other", err)
			}
		})
	}
}

// TestRetries: a 500 is retried a bounded number of times, a 4xx never.
func TestRetries(t *testing.T) {
	var n atomic.Int32
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) < 3 {
			w.WriteHeader(503)
			return
		}
		w.Write([]byte(`{"resource_providers":[]}`))
	})
	if _, err := c.Tree(context.Background(), "x"); err != nil || n.Load() != 3 {
		t.Fatalf("Tree = %v after %d requests, want success after 3", err, n.Load())
	}
	var m atomic.Int32
	c = serve(t, func(w http.ResponseWriter, r *http.Request) {
		m.Add(1)
		w.WriteHeader(500)
	})
	if _, err := c.Tree(context.Background(), "x"); !errors.Is(err, ErrServer) || m.Load() != 3 {
		t.Fatalf("Tree = %v after %d requests, want ErrServer after 1+2 retries", err, m.Load())
	}
	var k atomic.Int32
	c = serve(t, func(w http.ResponseWriter, r *http.Request) {
		k.Add(1)
		w.WriteHeader(400)
	})
	if _, err := c.Tree(context.Background(), "x"); !errors.Is(err, ErrBadRequest) || k.Load() != 1 {
		t.Fatalf("Tree = %v after %d requests, want one ErrBadRequest", err, k.Load())
	}
}

// TestTimeout: a server that does not answer is ErrUnreachable within the
// client's timeout, not the caller's.
func TestTimeout(t *testing.T) {
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(block)
	c, err := New(Config{Endpoint: srv.URL, Timeout: 50 * time.Millisecond, Retries: -1})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = c.Tree(context.Background(), "x")
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("Tree = %v, want ErrUnreachable", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %s", d)
	}
}

func TestOldServerRefused(t *testing.T) {
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"versions":[{"id":"v1.0","max_version":"1.30"}]}`))
	})
	if _, err := c.CheckVersion(context.Background()); !errors.Is(err, ErrVersion) {
		t.Fatalf("CheckVersion = %v, want ErrVersion", err)
	}
	c = serve(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"versions":[{"max_version":"one"}]}`)) })
	if _, err := c.CheckVersion(context.Background()); !errors.Is(err, ErrMalformed) {
		t.Fatalf("CheckVersion = %v, want ErrMalformed", err)
	}
}

func TestConsumerRejectsNonPositiveAmounts(t *testing.T) {
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"allocations":{"p":{"resources":{"CUSTOM_X":0}}},"consumer_generation":1}`))
	})
	if _, err := c.Consumer(context.Background(), "c"); !errors.Is(err, ErrMalformed) {
		t.Fatalf("Consumer = %v, want ErrMalformed", err)
	}
}

func TestExpectedGeneration(t *testing.T) {
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusConflict)
		w.Write([]byte(`{"errors":[{"status":409,"code":"placement.concurrent_update","detail":"There was a conflict.\n\n consumer generation conflict - expected 3 but got None"}]}`))
	})
	err := c.PutConsumer(context.Background(), "c", Consumer{Allocations: map[string]Allocation{"p": {Resources: map[string]int{"X": 1}}}})
	if g, ok := ExpectedGeneration(err); !ok || g != 3 || !errors.Is(err, ErrConflict) {
		t.Fatalf("ExpectedGeneration(%v) = %d, %v", err, g, ok)
	}
	if _, ok := ExpectedGeneration(ErrServer); ok {
		t.Fatal("a server error names a generation")
	}
}

// TestMaxBodyRaised: a caller that reads fleet-wide listings raises the
// bound; an answer over the default is read whole, and one over the raised
// bound is still refused.
func TestMaxBodyRaised(t *testing.T) {
	tree := `{"resource_providers":[{"uuid":"4f0b8f7e-2f55-4c1e-9a52-7d1b0c9e6a3d","name":"` + strings.Repeat("x", MaxBody) + `","generation":1}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(tree)) }))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		max  int
		want error
	}{{0, ErrTooLarge}, {2 * MaxBody, nil}, {MaxBody + 10, ErrTooLarge}} {
		c, err := New(Config{Endpoint: srv.URL, Timeout: 5 * time.Second, Backoff: time.Millisecond, MaxBody: tc.max})
		if err != nil {
			t.Fatal(err)
		}
		ps, err := c.Tree(context.Background(), "4f0b8f7e-2f55-4c1e-9a52-7d1b0c9e6a3d")
		if !errors.Is(err, tc.want) || (tc.want == nil && len(ps) != 1) {
			t.Errorf("MaxBody %d: Tree = %d providers, %v; want %v", tc.max, len(ps), err, tc.want)
		}
	}
}
