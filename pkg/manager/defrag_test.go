package manager_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

func TestPlanCapacityAndDefragment(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	ctx := context.Background()
	p, err := e.m.Plan(ctx, manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb"})
	if err != nil || !p.Fits || p.GPUPCI != sim.DefaultH100MIG || p.Start < 0 {
		t.Fatalf("plan %+v, %v", p, err)
	}
	if strings.Contains(e.summary(), "gi") {
		t.Fatal("plan changed the host")
	}
	count := func(profile string) int {
		caps, _ := e.m.Capacity()
		for _, c := range caps {
			if c.Model == "H100-SXM5-80GB" && c.Profile == profile {
				return c.Count
			}
		}
		return -1
	}
	if n := count("1g.10gb"); n != 7 {
		t.Fatalf("capacity 1g.10gb = %d, want 7", n)
	}
	// Seven 1g instances fill slots 0-6; freeing those at 1 and 2 leaves
	// three free slices (1, 2 and 7) and no legal 2g start (0, 2, 4).
	var ones []store.Instance
	for i := 0; i < 7; i++ {
		ones = append(ones, e.mustCreate("acme", "1g.10gb", sim.DefaultH100MIG))
	}
	for _, r := range ones {
		if r.GIStart == 1 || r.GIStart == 2 {
			if err := e.m.Destroy(ctx, r.UUID, manager.DestroyOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	req := manager.CreateRequest{Tenant: "acme", Profile: "2g.20gb", GPU: sim.DefaultH100MIG}
	if _, err := e.m.Create(ctx, req); !errors.Is(err, manager.ErrNoCapacity) || !strings.Contains(manager.Message(err), "fragment") {
		t.Fatalf("fragmented create: %v", err)
	}
	p, err = e.m.Plan(ctx, req)
	if err != nil || p.Fits || len(p.Moves) == 0 {
		t.Fatalf("plan of a fragmented request: %+v, %v", p, err)
	}
	before := e.summary()
	res, err := e.m.Defragment(ctx, req, false)
	if err != nil || len(res.Moves) == 0 || res.Applied || e.summary() != before {
		t.Fatalf("dry run: %+v, %v", res, err)
	}
	res, err = e.m.Defragment(ctx, req, true)
	if err != nil || !res.Applied {
		t.Fatalf("apply: %+v, %v", res, err)
	}
	moved, err := e.m.Instance(res.Moves[0].Instance)
	if err != nil || moved.GIStart != res.Moves[0].ToStart {
		t.Fatalf("moved instance %+v, %v; want start %d", moved, err, res.Moves[0].ToStart)
	}
	e.mustCreate("acme", "2g.20gb", sim.DefaultH100MIG)
	assertConsistent(t, e)
}

// fragmented fills the MIG H100 with 1g instances and frees the slots at
// 1 and 2, so that a 2g request needs a move.
func fragmented(t *testing.T, e *env) manager.CreateRequest {
	t.Helper()
	var ones []store.Instance
	for i := 0; i < 7; i++ {
		ones = append(ones, e.mustCreate("acme", "1g.10gb", sim.DefaultH100MIG))
	}
	for _, r := range ones {
		if r.GIStart == 1 || r.GIStart == 2 {
			if err := e.m.Destroy(context.Background(), r.UUID, manager.DestroyOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return manager.CreateRequest{Tenant: "acme", Profile: "2g.20gb", GPU: sim.DefaultH100MIG}
}

// defragmentAndFit checks the host is consistent, then that defragment
// works and the fragmented request fits after it.
func defragmentAndFit(t *testing.T, e *env, req manager.CreateRequest) {
	t.Helper()
	assertConsistent(t, e)
	if _, err := e.m.Defragment(context.Background(), req, true); err != nil {
		t.Fatalf("defragment: %v", err)
	}
	e.mustCreate("acme", req.Profile, req.GPU)
}

func placements(t *testing.T, e *env) string {
	t.Helper()
	insts, err := e.m.AllInstances()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, in := range insts {
		out = append(out, fmt.Sprintf("%s %s:%d %s", in.UUID, in.GPUPCI, in.GIStart, in.State))
	}
	return strings.Join(out, "\n")
}

// A move that fails at any step is undone: the instance is carved again
// where it was, the new placement holds nothing, no intent is left.
func TestFailedMoveIsUndone(t *testing.T) {
	cases := []struct {
		name  string
		fault sim.Fault
	}{
		{"release fails", sim.Fault{Op: "GpuInstanceDestroy", Return: 999, Count: 1}},
		{"GPU instance at the new place fails", sim.Fault{Op: "CreateGpuInstanceWithPlacement", Return: 999, Count: 1}},
		{"compute instance at the new place fails", sim.Fault{Op: "CreateComputeInstance", Return: 999, Count: 1}},
		{"GPU instance at the new place outruns the deadline", sim.Fault{Op: "CreateGpuInstanceWithPlacement", Delay: "400ms", Count: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, nil)
			e.tenant("acme", unlimited())
			req := fragmented(t, e)
			host, recs := e.discovered(), placements(t, e)
			if err := e.sim.AddFault(c.fault); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if c.fault.Delay != "" {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
			}
			res, err := e.m.Defragment(ctx, req, true)
			if err == nil {
				t.Fatal("defragment succeeded through a fault")
			}
			t.Logf("defragment: %+v: %v", res, err)
			if got := placements(t, e); got != recs {
				t.Fatalf("records after a failed move:\n%s\nwere\n%s", got, recs)
			}
			if got := e.discovered(); got != host {
				t.Fatalf("host after a failed move:\n%s\nwas\n%s", got, host)
			}
			defragmentAndFit(t, e, req)
		})
	}
}

// A crash half-way through a move is resolved by the next start: every
// instance is on the host once, nothing is left at the other placement.
func TestCrashedMoveIsResolved(t *testing.T) {
	for _, p := range []string{manager.CrashMoveRelease, manager.CrashMoveCarve} {
		t.Run(p, func(t *testing.T) {
			e := newEnv(t, nil)
			e.tenant("acme", unlimited())
			req := fragmented(t, e)
			n := len(strings.Split(placements(t, e), "\n"))
			e.crash = func(at string) {
				if at == p {
					runtime.Goexit()
				}
			}
			done := make(chan struct{})
			go func() { defer close(done); _, _ = e.m.Defragment(context.Background(), req, true) }()
			<-done
			rep := e.restart()
			if len(rep.Finished) != 1 {
				t.Fatalf("start-up reconcile did not resolve the move: %+v", rep)
			}
			if got := len(strings.Split(placements(t, e), "\n")); got != n {
				t.Fatalf("%d instances after the crash, want %d", got, n)
			}
			defragmentAndFit(t, e, req)
		})
	}
}
