package apply

import (
	"context"
	"sync"
)

// run carries out a sorted change set, the changes of different GPUs side
// by side. A real driver serialises the calls of one GPU and runs those of
// different GPUs at once, so applying a whole layout takes about as long
// as its busiest GPU instead of the sum of all of them:
//
//   - each GPU's destroys and MIG mode change, in that order, on one
//     worker per GPU (at most limit workers at once);
//   - the tenant changes, one after another, once every destroy is done
//     (an undefine needs its tenant's instances gone, a lowered quota its
//     usage down);
//   - each GPU's creates, largest first, once the tenants changed: a
//     GPU without MIG work starts creating while MIG modes change on
//     other GPUs;
//   - creates that name no GPU, one after another, at the end: placement
//     picks their GPU from what the others left.
//
// The manager's own locks keep each operation safe beside the others;
// this only orders them.
type run struct {
	ctx     context.Context
	m       Manager
	changes []Change
	sem     chan struct{}

	mu sync.Mutex
	// done holds the changes done, by index (a create with its instance).
	done []*Change
	// failed is the index of the first change that failed (-1: none),
	// failedAs that change as step saw it, err its error.
	failed   int
	failedAs Change
	err      error
}

func newRun(ctx context.Context, m Manager, changes []Change, limit int) *run {
	return &run{ctx: ctx, m: m, changes: changes, sem: make(chan struct{}, max(1, limit)), done: make([]*Change, len(changes)), failed: -1}
}

// gpuWork is one GPU's changes by stage, as indexes into run.changes.
type gpuWork struct {
	pre, creates []int
}

func (r *run) execute() {
	var order []string
	work := map[string]*gpuWork{}
	var tenants, loose []int
	for i, c := range r.changes {
		id := gpuID(c)
		switch {
		case c.Op == OpDefineTenant || c.Op == OpUpdateTenant || c.Op == OpUndefineTenant:
			tenants = append(tenants, i)
			continue
		case id == "" && c.Op == OpCreate:
			loose = append(loose, i)
			continue
		}
		w := work[id]
		if w == nil {
			w = &gpuWork{}
			work[id] = w
			order = append(order, id)
		}
		if c.Op == OpCreate || c.Op == OpSetGPUInstanceScheduler {
			// A GPU instance's scheduler is set once the creates made it.
			w.creates = append(w.creates, i)
		} else {
			w.pre = append(w.pre, i) // destroys sort before MIG mode changes
		}
	}
	var destroyed, all sync.WaitGroup
	tenantsDone := make(chan struct{})
	for _, id := range order {
		w := work[id]
		destroyed.Add(1)
		all.Add(1)
		go func() {
			defer all.Done()
			r.stage(w.pre, destroyed.Done)
			<-tenantsDone
			r.stage(w.creates, nil)
		}()
	}
	destroyed.Wait()
	r.serial(tenants)
	close(tenantsDone)
	all.Wait()
	r.serial(loose)
}

// stage runs one GPU's changes of a stage in order, holding one of the
// limit slots; afterDestroys (when set) is called once the stage's
// destroys are over, whether they were done or not.
func (r *run) stage(idx []int, afterDestroys func()) {
	signalled := false
	signal := func() {
		if afterDestroys != nil && !signalled {
			signalled = true
			afterDestroys()
		}
	}
	defer signal()
	if len(idx) == 0 {
		return
	}
	select {
	case r.sem <- struct{}{}:
	case <-r.ctx.Done():
		r.fail(idx[0], r.changes[idx[0]], r.ctx.Err())
		return
	}
	defer func() { <-r.sem }()
	for k, i := range idx {
		if r.changes[i].Op != OpDestroy {
			signal()
		}
		if !r.do(i, wanted(r.pick(idx[k+1:]))) {
			return
		}
	}
}

// serial runs changes one after another.
func (r *run) serial(idx []int) {
	for k, i := range idx {
		if !r.do(i, wanted(r.pick(idx[k+1:]))) {
			return
		}
	}
}

func (r *run) pick(idx []int) []Change {
	out := make([]Change, 0, len(idx))
	for _, i := range idx {
		out = append(out, r.changes[i])
	}
	return out
}

// do performs change i unless the run has stopped; it reports whether the
// run goes on.
func (r *run) do(i int, wanted map[string]int) bool {
	r.mu.Lock()
	stopped := r.failed >= 0
	r.mu.Unlock()
	if stopped {
		return false
	}
	c := r.changes[i]
	err := r.ctx.Err()
	if err == nil {
		c, err = step(r.ctx, r.m, c, wanted)
	}
	if err != nil {
		r.fail(i, c, err)
		return false
	}
	r.mu.Lock()
	r.done[i] = &c
	r.mu.Unlock()
	return true
}

// fail records a failure; the first one is the run's.
func (r *run) fail(i int, c Change, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed < 0 {
		r.failed, r.failedAs, r.err = i, c, err
	}
}
