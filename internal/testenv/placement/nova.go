package placement

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// novaSched is the driver: Nova's request parser and report client behind
// JSON lines (see its header).
//
//go:embed novasched.py
var novaSched []byte

// novaReport is the module the driver imports; without it python3-nova is
// not installed.
const novaReport = "/usr/lib/python3/dist-packages/nova/scheduler/client/report.py"

// NovaMaxAttempts is nova's [scheduler] max_attempts default: the hosts
// one instance is tried on (the first and its alternates).
const NovaMaxAttempts = 3

// Nova is one running driver: nova-scheduler's own code (Debian's
// python3-nova) against a Placement, serving many requests at once.
type Nova struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	// Log is the driver's stderr (Nova's own log lines).
	Log *logBuffer

	mu      sync.Mutex
	next    int
	pending map[int]chan novaAnswer
	err     error // set once the driver is gone
}

type logBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	return len(p), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}

type novaAnswer struct {
	ID          int             `json:"id"`
	Error       string          `json:"error"`
	Trace       string          `json:"trace"`
	Query       string          `json:"query"`
	Candidates  []NovaCandidate `json:"candidates"`
	Version     string          `json:"version"`
	Claimed     bool            `json:"claimed"`
	Deleted     bool            `json:"deleted"`
	Allocations *NovaConsumer   `json:"allocations"`
	Ready       bool            `json:"ready"`
}

// NovaCandidate is one allocation request as Placement returned it to
// nova (the body Nova claims with).
type NovaCandidate struct {
	Allocations map[string]struct {
		Resources map[string]int `json:"resources"`
	} `json:"allocations"`
}

// Providers are the candidate's providers.
func (c NovaCandidate) Providers() []string {
	var out []string
	for p := range c.Allocations {
		out = append(out, p)
	}
	return out
}

// NovaConsumer is get_allocs_for_consumer's document.
type NovaConsumer struct {
	Allocations map[string]struct {
		Resources map[string]int `json:"resources"`
	} `json:"allocations"`
	ConsumerGeneration *int   `json:"consumer_generation"`
	ProjectID          string `json:"project_id"`
	UserID             string `json:"user_id"`
}

// Flavor is a Nova flavor: its size and extra specs.
type Flavor struct {
	Name     string
	VCPUs    int
	MemoryMB int
	RootGB   int
	// ExtraSpecs as `openstack flavor set --property K=V` sets them.
	ExtraSpecs map[string]string
}

// NovaQuery is what nova-scheduler asked Placement for a flavor and what
// it got.
type NovaQuery struct {
	// Query is ResourceRequest.to_querystring(), what it sends.
	Query string
	// Candidates are the allocation requests in Placement's order.
	Candidates []NovaCandidate
	// Version is the microversion they were asked at (claims use it).
	Version string
}

// StartNova starts the driver against Placement at endpoint until the test
// ends. It skips (or fails, with VGPUD_TEST_REQUIRE_SERVICES=1) when
// python3-nova is not installed.
func StartNova(t testing.TB, endpoint string) *Nova {
	t.Helper()
	if _, err := os.Stat(novaReport); err != nil {
		skip(t, "python3-nova is not installed (apt-get install python3-nova)")
	}
	dir := t.TempDir()
	// timeout: a Placement that stopped answering must not hang a
	// scheduler (keystoneauth has none by default).
	conf := fmt.Sprintf("[DEFAULT]\nuse_stderr = true\n[placement]\nauth_type = admin_token\nendpoint = %s\ntoken = admin\nregion_name = RegionOne\ntimeout = 10\n", endpoint)
	confPath, script := filepath.Join(dir, "nova.conf"), filepath.Join(dir, "novasched.py")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, novaSched, 0o644); err != nil {
		t.Fatal(err)
	}
	n := &Nova{Log: &logBuffer{}, pending: map[int]chan novaAnswer{}, done: make(chan struct{})}
	// Debian's python3: another python3 on PATH may not see python3-nova.
	n.cmd = exec.Command("/usr/bin/python3", script, confPath)
	n.cmd.Stderr = n.Log
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := n.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := n.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	n.stdin = stdin
	ready := make(chan struct{})
	n.pending[0] = make(chan novaAnswer, 1)
	if err := n.cmd.Start(); err != nil {
		t.Fatalf("start the nova driver: %v", err)
	}
	go n.read(stdout)
	go func() {
		a := <-n.pending[0]
		if a.Ready {
			close(ready)
		}
	}()
	t.Cleanup(n.stop)
	select {
	case <-ready:
	case <-n.done:
		t.Fatalf("the nova driver exited during start-up: %v\n%s", n.err, n.Log.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("the nova driver was not ready within 60s:\n%s", n.Log.String())
	}
	return n
}

// read dispatches the driver's answers until it exits.
func (n *Nova) read(stdout io.Reader) {
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var a novaAnswer
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			continue
		}
		n.mu.Lock()
		ch := n.pending[a.ID]
		delete(n.pending, a.ID)
		n.mu.Unlock()
		if ch != nil {
			ch <- a
		}
	}
	err := n.cmd.Wait()
	n.mu.Lock()
	n.err = fmt.Errorf("nova driver exited: %v", err)
	for id, ch := range n.pending {
		close(ch)
		delete(n.pending, id)
	}
	n.mu.Unlock()
	close(n.done)
}

func (n *Nova) stop() {
	_ = n.stdin.Close()
	select {
	case <-n.done:
	case <-time.After(10 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.done
	}
}

// call sends one request and waits for its answer.
func (n *Nova) call(ctx context.Context, req map[string]any) (novaAnswer, error) {
	n.mu.Lock()
	if n.err != nil {
		n.mu.Unlock()
		return novaAnswer{}, n.err
	}
	n.next++
	id := n.next
	ch := make(chan novaAnswer, 1)
	n.pending[id] = ch
	req["id"] = id
	b, err := json.Marshal(req)
	if err == nil {
		_, err = n.stdin.Write(append(b, '\n'))
	}
	n.mu.Unlock()
	if err != nil {
		return novaAnswer{}, fmt.Errorf("nova driver: %w", err)
	}
	select {
	case a, ok := <-ch:
		if !ok {
			return novaAnswer{}, n.err
		}
		if a.Error != "" {
			return a, fmt.Errorf("nova %s: %s", req["op"], a.Error)
		}
		return a, nil
	case <-ctx.Done():
		n.mu.Lock()
		delete(n.pending, id)
		n.mu.Unlock()
		return novaAnswer{}, ctx.Err()
	}
}

func flavorDoc(f Flavor) map[string]any {
	specs := f.ExtraSpecs
	if specs == nil {
		specs = map[string]string{}
	}
	return map[string]any{"vcpus": f.VCPUs, "memory_mb": f.MemoryMB, "root_gb": f.RootGB, "extra_specs": specs}
}

// Query builds ResourceRequest.from_request_spec from the flavor and asks
// Placement for candidates as nova-scheduler does (limit=1000). No
// candidates is an empty list; Placement refusing the query an error.
func (n *Nova) Query(ctx context.Context, f Flavor) (NovaQuery, error) {
	a, err := n.call(ctx, map[string]any{"op": "query", "flavor": flavorDoc(f)})
	if err != nil {
		return NovaQuery{}, err
	}
	if a.Version == "" {
		return NovaQuery{Query: a.Query}, fmt.Errorf("nova: Placement did not answer %s with candidates", a.Query)
	}
	return NovaQuery{Query: a.Query, Candidates: a.Candidates, Version: a.Version}, nil
}

// Claim is nova.scheduler.utils.claim_resources for a new consumer: false
// when Placement refused it (another claim took the room).
func (n *Nova) Claim(ctx context.Context, consumer string, c NovaCandidate, version string) (bool, error) {
	a, err := n.call(ctx, map[string]any{"op": "claim", "consumer": consumer, "alloc_req": c, "version": version,
		"project_id": "fleet", "user_id": "scheduler"})
	return a.Claimed, err
}

// Delete is delete_allocation_for_instance(force=True), what the compute
// manager does before a reschedule: false when there was none.
func (n *Nova) Delete(ctx context.Context, consumer string) (bool, error) {
	a, err := n.call(ctx, map[string]any{"op": "delete", "consumer": consumer})
	return a.Deleted, err
}

// Allocations is get_allocs_for_consumer.
func (n *Nova) Allocations(ctx context.Context, consumer string) (NovaConsumer, error) {
	a, err := n.call(ctx, map[string]any{"op": "allocs", "consumer": consumer})
	if err != nil || a.Allocations == nil {
		return NovaConsumer{}, err
	}
	return *a.Allocations, nil
}

// NovaHost is a host as the Nova scheduler drives it: the create on the
// GPU of the chosen provider, carrying the consumer.
type NovaHost interface {
	Host
	// CreateOn carves profile for consumer on the GPU whose provider is
	// provider (as nova-compute passes the chosen device).
	CreateOn(ctx context.Context, consumer, profile, provider string) error
}

// NovaScheduler schedules as nova-scheduler and nova-conductor do: one
// query per request, hosts in random order (host_subset_size) with one
// allocation request each (the first Placement gave for the host), the
// claim; a host's refusal that Reschedule accepts deletes the allocation
// and tries the next host with the same instance UUID, up to
// NovaMaxAttempts hosts. A claim Placement refuses moves on without
// counting an attempt.
type NovaScheduler struct {
	Nova  *Nova
	Hosts []NovaHost
	// Reschedule reports whether a host's refusal is one Nova retries
	// elsewhere (a stale claim).
	Reschedule func(error) bool
	// First, when set, is tried before the other hosts (a test's choice of
	// where the first attempt goes).
	First NovaHost
	// Counters.
	Placed, NoCandidate, ClaimLost, Rescheduled, Refused atomic.Int64

	mu sync.Mutex
	// unsettled are consumers whose claim may be left in Placement: a
	// claim or delete that failed (Placement went away), as a Nova whose
	// compute could not delete the allocation leaves it to Placement's
	// orphan handling.
	unsettled map[string]bool
}

// Unsettled are the consumers whose claim a failed request may have left
// in Placement.
func (s *NovaScheduler) Unsettled() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for c := range s.unsettled {
		out = append(out, c)
	}
	return out
}

// Place schedules consumer for flavor (profile is what the host carves)
// and returns the host and provider it was created on.
func (s *NovaScheduler) Place(ctx context.Context, f Flavor, profile, consumer string, rnd *rand.Rand) (NovaHost, string, error) {
	claimed := false
	h, p, err := s.place(ctx, f, profile, consumer, rnd, &claimed)
	if err != nil && claimed && !errors.Is(err, ErrNoValidHost) {
		s.mayBeLeft(consumer)
	}
	return h, p, err
}

// mayBeLeft notes a consumer whose claim may be left in Placement.
func (s *NovaScheduler) mayBeLeft(consumer string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unsettled == nil {
		s.unsettled = map[string]bool{}
	}
	s.unsettled[consumer] = true
}

// ErrNoValidHost is Nova's NoValidHost: no candidate, or every attempt
// refused.
var ErrNoValidHost = errors.New("no valid host")

func (s *NovaScheduler) place(ctx context.Context, f Flavor, profile, consumer string, rnd *rand.Rand, claimed *bool) (NovaHost, string, error) {
	q, err := s.Nova.Query(ctx, f)
	if err != nil {
		return nil, "", err
	}
	type choice struct {
		h    NovaHost
		cand NovaCandidate
		gpu  string
	}
	var choices []choice
	seen := map[NovaHost]bool{}
	for _, c := range q.Candidates {
		h, gpu := s.HostOf(c)
		if h == nil || seen[h] {
			continue
		}
		seen[h] = true
		choices = append(choices, choice{h, c, gpu})
	}
	if rnd != nil {
		rnd.Shuffle(len(choices), func(i, j int) { choices[i], choices[j] = choices[j], choices[i] })
	}
	if s.First != nil {
		for i, c := range choices {
			if c.h == s.First {
				choices[0], choices[i] = choices[i], choices[0]
			}
		}
	}
	attempts := 0
	var last error
	for _, c := range choices {
		if attempts == NovaMaxAttempts {
			break
		}
		*claimed = true
		ok, err := s.Nova.Claim(ctx, consumer, c.cand, q.Version)
		if err != nil {
			return nil, "", err
		}
		if !ok {
			s.ClaimLost.Add(1)
			continue
		}
		attempts++
		err = c.h.CreateOn(ctx, consumer, profile, c.gpu)
		if err == nil {
			s.Placed.Add(1)
			return c.h, c.gpu, nil
		}
		last = fmt.Errorf("%s: %w", c.h.Name(), err)
		// Before a reschedule (and when the build fails for good) the
		// compute manager deletes the instance's allocation.
		deleted, derr := s.Nova.Delete(ctx, consumer)
		if derr != nil {
			return nil, "", errors.Join(last, derr)
		}
		if !deleted {
			// Nova's report client turns a Placement that does not
			// answer into "nothing deleted" (safe_connect swallows
			// ConnectFailure): the claim may be left, as Nova leaves it.
			s.mayBeLeft(consumer)
		}
		if s.Reschedule == nil || !s.Reschedule(err) {
			s.Refused.Add(1)
			return nil, "", last
		}
		s.Rescheduled.Add(1)
	}
	s.NoCandidate.Add(1)
	if last != nil {
		return nil, "", fmt.Errorf("%w after %d attempts: %w", ErrNoValidHost, attempts, last)
	}
	return nil, "", ErrNoValidHost
}

// HostOf is the host owning the candidate's GPU provider, and that
// provider (a candidate under nova-compute also names the compute node).
func (s *NovaScheduler) HostOf(c NovaCandidate) (NovaHost, string) {
	for p := range c.Allocations {
		for _, h := range s.Hosts {
			if h.Owns(p) {
				return h, p
			}
		}
	}
	return nil, ""
}
