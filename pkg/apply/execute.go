package apply

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/vgpud/vgpud/pkg/manager"
)

// Result is what Execute did: the changes done, in Execute's order (a
// create with the new instance's UUID), the change that failed and why.
// After a failure no further change is begun.
type Result struct {
	Done   []Change `json:"done"`
	Failed *Change  `json:"failed,omitempty"`
	Error  string   `json:"error,omitempty"`
	// Remaining counts the changes not attempted after a failure (with
	// a change that failed on another GPU meanwhile among them).
	Remaining int `json:"remaining,omitempty"`
}

// Execute performs a change set through the manager's operations in a
// safe order whatever the order given: destroys first (they free room and
// let MIG modes change), then MIG modes, then tenants (defines and updates,
// then undefines), then creates, largest profiles first so small instances
// do not fragment the room large ones need. The changes of different GPUs
// run side by side (see run.go): each GPU keeps that order for its own
// changes, the tenants change once every destroy is done, and a GPU's
// creates begin once the tenants changed. It stops at the first error
// (no further change is begun; those in flight on other GPUs finish) and
// returns it, wrapped with what was done, keeping the manager's sentinel
// (errors.Is(err, manager.ErrNoCapacity) and so on); the Result says the
// same. A destroy of an instance already gone counts as done.
//
// Before the first change the whole change set is checked, against the
// host as it is now: its size, and whether what it creates fits the GPUs
// and the tenants' quotas (see preflight). A change set that cannot be
// carried out is refused with a *PreflightError, and nothing is done.
//
// Each step is one manager operation, which undoes itself on failure, so
// the host is left with the steps done before the failure. Diff again to
// see what remains.
func Execute(ctx context.Context, m Manager, cs ChangeSet) (Result, error) {
	return ExecuteWith(ctx, m, cs, Limits{})
}

// ExecuteWith is Execute within lim.
func ExecuteWith(ctx context.Context, m Manager, cs ChangeSet, lim Limits) (Result, error) {
	changes := slices.Clone(cs.Changes)
	sortChanges(changes)
	res := Result{Done: []Change{}}
	if len(changes) > 0 && ctx.Err() == nil {
		h, err := check(m, cs, lim)
		if err != nil {
			res.Error = manager.Message(err)
			res.Remaining = len(changes)
			return res, err
		}
		// One name per GPU: the run orders each GPU's changes by it, and
		// a change set edited since its dry run may name a GPU by its
		// PCI address in one change and by its UUID in another.
		for i := range changes {
			if g, ok := h.findGPU(gpuID(changes[i])); ok && changes[i].GPUUUID == "" {
				changes[i].GPUUUID = g.UUID
			}
		}
	}
	r := newRun(ctx, m, changes, lim.concurrency())
	r.execute()
	for i := range r.done {
		if r.done[i] != nil {
			res.Done = append(res.Done, *r.done[i])
		}
	}
	if r.failed < 0 {
		return res, nil
	}
	res.Failed = &changes[r.failed]
	res.Error = manager.Message(r.err)
	res.Remaining = len(changes) - len(res.Done) - 1
	return res, fmt.Errorf("apply: %s: %w (%d of %d changes done before it; %d not attempted)",
		r.failedAs, r.err, len(res.Done), len(changes), res.Remaining)
}

// check is the pre-flight of a change set: its size, then the host as it
// is now.
func check(m Manager, cs ChangeSet, lim Limits) (*host, error) {
	if err := checkSize(cs, lim); err != nil {
		return nil, err
	}
	h, err := readHost(m)
	if err != nil {
		return nil, fmt.Errorf("apply: read the host before the first change: %w", err)
	}
	return h, preflight(h, cs)
}

// wanted counts the creates still to come by profile name: placement keeps
// room for them when it picks a GPU for a time-sliced vGPU.
func wanted(rest []Change) map[string]int {
	var w map[string]int
	for _, c := range rest {
		if c.Op == OpCreate {
			if w == nil {
				w = map[string]int{}
			}
			w[c.Profile]++
		}
	}
	return w
}

// step performs one change; wanted are the creates after it.
func step(ctx context.Context, m Manager, c Change, wanted map[string]int) (Change, error) {
	switch c.Op {
	case OpDestroy:
		err := m.Destroy(ctx, c.Instance, manager.DestroyOptions{})
		if errors.Is(err, manager.ErrNotFound) {
			err = nil
		}
		return c, err
	case OpSetMIGMode:
		if c.MIG == nil {
			return c, fmt.Errorf("%w: set-mig-mode change without a mode", manager.ErrInvalidArgument)
		}
		return c, m.SetMIGMode(ctx, gpuID(c), *c.MIG)
	case OpSetScheduler:
		if c.Scheduler == nil {
			return c, fmt.Errorf("%w: set-scheduler change without a setting", manager.ErrInvalidArgument)
		}
		r, err := c.Scheduler.request()
		if err != nil {
			return c, fmt.Errorf("%w: %v", manager.ErrInvalidArgument, err)
		}
		_, err = m.SetGPUScheduler(ctx, gpuID(c), r)
		return c, err
	case OpSetGPUInstanceScheduler:
		return c, setGPUInstanceSchedulers(ctx, m, c)
	case OpDefineTenant, OpUpdateTenant:
		if c.Settings == nil {
			// Zero settings would be a tenant that may hold nothing.
			return c, fmt.Errorf("%w: %s change for tenant %s without settings", manager.ErrInvalidArgument, c.Op, c.Tenant)
		}
		var err error
		if c.Op == OpDefineTenant {
			_, err = m.DefineTenant(ctx, c.Settings.tenant(c.Tenant))
		} else {
			_, err = m.UpdateTenant(ctx, c.Settings.tenant(c.Tenant))
		}
		return c, err
	case OpUndefineTenant:
		return c, m.UndefineTenant(ctx, c.Tenant, false)
	case OpCreate:
		// The short name, as `vgpuctl create` stores it: the change names
		// its GPU, which resolves the name to that GPU's model. Only a
		// change without a GPU needs the model to pin the name down.
		profile := c.Profile
		if c.Model != "" && gpuID(c) == "" {
			profile = c.Model + "/" + c.Profile
		}
		rec, err := m.Create(ctx, manager.CreateRequest{Tenant: c.Tenant, Profile: profile, GPU: gpuID(c), Wanted: wanted})
		if err == nil {
			c.Instance = rec.UUID
		}
		return c, err
	}
	return c, fmt.Errorf("%w: unknown change %q", manager.ErrInvalidArgument, c.Op)
}

// gpuID names the change's GPU by UUID, which no reordering of the bus changes.
func gpuID(c Change) string {
	if c.GPUUUID != "" {
		return c.GPUUUID
	}
	return c.GPU
}
