package placementapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Version is the microversion the client asks for; MinVersion the oldest
// it works with (consumer_type in allocations).
const (
	Version    = "1.39"
	MinVersion = "1.38"
)

// MaxBody bounds every answer the client reads: the largest legitimate one
// (a provider tree's allocations) is far smaller, so a bigger one is a
// broken or hostile server, not data.
const MaxBody = 4 << 20

// The client's error kinds. Every error it returns wraps one of them.
var (
	// ErrConflict is a 409 placement.concurrent_update: a provider or
	// consumer generation changed; re-read it and retry.
	ErrConflict = errors.New("placement: generation conflict")
	// ErrCapacity is a 409 other than a generation conflict: the
	// allocation exceeds an inventory, or an inventory is in use.
	ErrCapacity = errors.New("placement: refused (capacity or in use)")
	ErrNotFound = errors.New("placement: not found")
	// ErrBadRequest is a 400: the client sent something Placement refuses.
	ErrBadRequest  = errors.New("placement: bad request")
	ErrVersion     = errors.New("placement: microversion not supported")
	ErrServer      = errors.New("placement: server error")
	ErrMalformed   = errors.New("placement: malformed answer")
	ErrRedirect    = errors.New("placement: redirect refused")
	ErrTooLarge    = errors.New("placement: answer too large")
	ErrUnreachable = errors.New("placement: unreachable")
	ErrAuth        = errors.New("placement: authentication refused")
)

// Kind is the short name of err's kind ("conflict", "server", ...), for
// metrics labels and logs; "other" when it wraps none.
func Kind(err error) string {
	for _, k := range []struct {
		err  error
		name string
	}{{ErrConflict, "conflict"}, {ErrCapacity, "capacity"}, {ErrNotFound, "not_found"}, {ErrBadRequest, "bad_request"},
		{ErrVersion, "version"}, {ErrServer, "server"}, {ErrMalformed, "malformed"}, {ErrRedirect, "redirect"},
		{ErrTooLarge, "too_large"}, {ErrUnreachable, "unreachable"}, {ErrAuth, "auth"}} {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return "other"
}

// Config is how to reach Placement.
type Config struct {
	// Endpoint is the API's base URL, e.g. http://placement:8778.
	Endpoint string
	// Token is a keystone token sent as X-Auth-Token; with noauth2 any
	// value is accepted and "admin" is used when Token is empty.
	Token string
	// Timeout bounds each HTTP exchange (default 5 s).
	Timeout time.Duration
	// Retries is how many times a transient failure (unreachable, 5xx) is
	// retried (default 2); Backoff the first wait, doubled each time
	// (default 100 ms).
	Retries int
	Backoff time.Duration
	// MaxBody bounds each answer read (default MaxBody). vgpud reads its
	// own host's tree and names, far below it; a fleet-wide listing (every
	// provider of a class, allocation candidates with their summaries) at
	// a thousand hosts is larger, and a caller that asks one says so here.
	MaxBody int
}

// Client talks to one Placement endpoint. It is safe for concurrent use.
type Client struct {
	cfg  Config
	base *url.URL
	http *http.Client
	// Requests counts HTTP exchanges (for requests-per-operation figures).
	requests atomic.Uint64
}

// New checks cfg and returns a client; nothing is sent yet.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(cfg.Endpoint, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("placement endpoint %q is not an http(s) URL: %w", redact(cfg.Endpoint), ErrBadRequest)
	}
	if u.User != nil {
		// A password there would be shown wherever the endpoint is (fleet
		// status, the log); the credential belongs in the token file.
		return nil, fmt.Errorf("placement endpoint %s carries user information; put the credential in fleet.tokenFile and leave it out of the URL: %w", redact(cfg.Endpoint), ErrBadRequest)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("placement endpoint %s: port %s is not 1 to 65535: %w", redact(cfg.Endpoint), p, ErrBadRequest)
		}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Retries < 0 {
		cfg.Retries = 0
	} else if cfg.Retries == 0 {
		cfg.Retries = 2
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = 100 * time.Millisecond
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = MaxBody
	}
	if cfg.Token == "" {
		cfg.Token = "admin"
	}
	hc := &http.Client{
		Timeout: cfg.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	return &Client{cfg: cfg, base: u, http: hc}, nil
}

// redact hides the user information of an endpoint that may not parse as a
// URL at all: everything between "//" and the last "@" before the path.
func redact(endpoint string) string {
	rest, ok := strings.CutPrefix(endpoint, "//")
	scheme := ""
	if i := strings.Index(endpoint, "://"); i >= 0 {
		scheme, rest, ok = endpoint[:i+3], endpoint[i+3:], true
	}
	if !ok {
		return endpoint
	}
	auth, path := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		auth, path = rest[:i], rest[i:]
	}
	if i := strings.LastIndex(auth, "@"); i >= 0 {
		return scheme + "xxxxx@" + auth[i+1:] + path
	}
	return endpoint
}

// Requests is how many HTTP exchanges the client has made.
func (c *Client) Requests() uint64 { return c.requests.Load() }

// Endpoint is the API's base URL.
func (c *Client) Endpoint() string { return c.base.String() }

// Do sends one request and decodes a 2xx JSON answer into out (nil: the
// body is discarded). Transient failures are retried with backoff; a 4xx
// never is.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	_, err := c.DoStatus(ctx, method, path, in, out)
	return err
}

// DoStatus is Do, returning the status of the last answer too (0: none
// came): a 2xx tells apart what Placement made (201) from what it had
// (204).
func (c *Client) DoStatus(ctx context.Context, method, path string, in, out any) (int, error) {
	var body []byte
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, fmt.Errorf("encode %s %s: %w", method, path, err)
		}
		body = b
	}
	wait := c.cfg.Backoff
	var err error
	for attempt := 0; ; attempt++ {
		var status int
		status, err = c.once(ctx, method, path, body, out)
		if err == nil || attempt >= c.cfg.Retries || !transient(err) {
			return status, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, fmt.Errorf("%w (gave up: %w)", err, ctx.Err())
		case <-t.C:
		}
		wait *= 2
	}
}

func transient(err error) bool {
	return errors.Is(err, ErrUnreachable) || errors.Is(err, ErrServer)
}

func (c *Client) once(ctx context.Context, method, path string, body []byte, out any) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base.String()+path, rd)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w: %w", method, path, ErrBadRequest, err)
	}
	req.Header.Set("X-Auth-Token", c.cfg.Token)
	req.Header.Set("OpenStack-API-Version", "placement "+Version)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c.requests.Add(1)
	resp, err := c.http.Do(req)
	if err != nil {
		// A refused connection, a timeout or a cancel: Placement did not
		// answer, which the caller may retry later.
		return 0, fmt.Errorf("%s %s: %w: %w", method, path, ErrUnreachable, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, int64(c.cfg.MaxBody)+1))
	if err != nil {
		return resp.StatusCode, fmt.Errorf("%s %s: reading the answer: %w: %w", method, path, ErrUnreachable, err)
	}
	if len(data) > c.cfg.MaxBody {
		return resp.StatusCode, fmt.Errorf("%s %s: answer over %d bytes: %w", method, path, c.cfg.MaxBody, ErrTooLarge)
	}
	if err := statusError(resp.StatusCode, data); err != nil {
		return resp.StatusCode, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return resp.StatusCode, nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return resp.StatusCode, fmt.Errorf("%s %s: %w: %w", method, path, ErrMalformed, err)
	}
	return resp.StatusCode, nil
}

// apiErrors is Placement's error document.
type apiErrors struct {
	Errors []struct {
		Status int    `json:"status"`
		Code   string `json:"code"`
		Title  string `json:"title"`
		Detail string `json:"detail"`
	} `json:"errors"`
}

func statusError(status int, data []byte) error {
	if status >= 200 && status < 300 {
		return nil
	}
	var ae apiErrors
	_ = json.Unmarshal(data, &ae) // best effort: the status decides
	code, detail := "", strings.TrimSpace(string(data))
	if len(ae.Errors) > 0 {
		code, detail = ae.Errors[0].Code, strings.TrimSpace(ae.Errors[0].Detail)
	}
	if len(detail) > 300 {
		detail = detail[:300] + "..."
	}
	switch {
	case status >= 300 && status < 400:
		return fmt.Errorf("status %d: %w", status, ErrRedirect)
	case status == http.StatusConflict && code == "placement.concurrent_update":
		return &conflictError{detail: detail}
	case status == http.StatusConflict:
		return fmt.Errorf("%w: %s (%s)", ErrCapacity, detail, code)
	case status == http.StatusNotFound:
		return fmt.Errorf("%w: %s", ErrNotFound, detail)
	case status == http.StatusNotAcceptable:
		return fmt.Errorf("%w: placement %s: %s", ErrVersion, Version, detail)
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return fmt.Errorf("%w: status %d", ErrAuth, status)
	case status >= 500:
		return fmt.Errorf("%w: status %d: %s", ErrServer, status, detail)
	}
	return fmt.Errorf("%w: status %d: %s", ErrBadRequest, status, detail)
}

// conflictError is a generation conflict; its detail may name the
// generation Placement expected.
type conflictError struct{ detail string }

func (e *conflictError) Error() string { return ErrConflict.Error() + ": " + e.detail }
func (e *conflictError) Unwrap() error { return ErrConflict }

// ExpectedGeneration is the consumer generation a conflict says Placement
// expected ("expected 0 but got None"). Placement keeps a consumer whose
// allocations are all gone, at its last generation, while GET
// /allocations of it shows no generation: a writer that sent none learns it
// here.
func ExpectedGeneration(err error) (int, bool) {
	var ce *conflictError
	if !errors.As(err, &ce) {
		return 0, false
	}
	_, rest, ok := strings.Cut(ce.detail, "expected ")
	if !ok {
		return 0, false
	}
	num, _, _ := strings.Cut(rest, " ")
	n, err2 := strconv.Atoi(num)
	return n, err2 == nil
}
