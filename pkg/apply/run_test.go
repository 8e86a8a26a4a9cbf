package apply_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// overlapManager counts the creates in flight, in all and per GPU. A
// create waits (at most a second) until want creates are in flight, so a
// run that creates on one GPU at a time shows 1 however the goroutines are
// scheduled, and one that runs the GPUs side by side shows want.
type overlapManager struct {
	*manager.Manager
	want int
	wait time.Duration

	mu     sync.Mutex
	cond   *sync.Cond
	in     int
	most   int
	perGPU map[string]int
	mostOn int
}

func (o *overlapManager) Create(ctx context.Context, req manager.CreateRequest) (store.Instance, error) {
	o.mu.Lock()
	o.in++
	o.perGPU[req.GPU]++
	o.most, o.mostOn = max(o.most, o.in), max(o.mostOn, o.perGPU[req.GPU])
	o.cond.Broadcast()
	deadline := time.Now().Add(o.wait)
	for o.in < o.want && time.Now().Before(deadline) {
		go func() { time.Sleep(10 * time.Millisecond); o.cond.Broadcast() }()
		o.cond.Wait()
	}
	o.mu.Unlock()
	rec, err := o.Manager.Create(ctx, req)
	o.mu.Lock()
	o.in--
	o.perGPU[req.GPU]--
	o.mu.Unlock()
	return rec, err
}

// A layout's creates on different GPUs are in flight together; those of
// one GPU one after another.
func TestExecuteRunsGPUsSideBySide(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cs, err := apply.Diff(ctx, e.m, mustParse(t, "vgpud.yaml", ""))
	if err != nil {
		t.Fatal(err)
	}
	gpus := map[string]bool{}
	for _, c := range cs.Changes {
		if c.Op == apply.OpCreate {
			gpus[c.GPUUUID] = true
		}
	}
	if len(gpus) < 2 {
		t.Fatalf("the sample creates on %d GPUs; the test needs two or more", len(gpus))
	}
	o := &overlapManager{Manager: e.m, want: len(gpus), wait: time.Second, perGPU: map[string]int{}}
	o.cond = sync.NewCond(&o.mu)
	if _, err := apply.Execute(ctx, o, cs); err != nil {
		t.Fatal(err)
	}
	if o.most != len(gpus) || o.mostOn != 1 {
		t.Fatalf("at most %d creates in flight (%d on one GPU), want %d (1 per GPU)", o.most, o.mostOn, len(gpus))
	}
	// Limits.Concurrency 1 is the serial way.
	e2 := newEnv(t)
	cs2, _ := apply.Diff(ctx, e2.m, mustParse(t, "vgpud.yaml", ""))
	o2 := &overlapManager{Manager: e2.m, want: 2, wait: 50 * time.Millisecond, perGPU: map[string]int{}}
	o2.cond = sync.NewCond(&o2.mu)
	if _, err := apply.ExecuteWith(ctx, o2, cs2, apply.Limits{Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	if o2.most != 1 {
		t.Fatalf("with concurrency 1, %d creates in flight at once", o2.most)
	}
}
