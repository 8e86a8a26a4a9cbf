package dbusapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/vgpud/vgpud/pkg/apply"
)

// Share is one instance's compute share over the share engine's last
// window, in milli-GPU (1000 = one whole GPU).
type Share struct {
	Instance      string
	EntitledMilli uint64
	// AchievedMilli is the compute the instance got, DemandMilli what it
	// asked for; Interference is max(0, 1 - achieved/min(demand, entitled)).
	// A negative value is unknown.
	AchievedMilli, DemandMilli, Interference float64
}

// SharesSource is what GetShares needs from the share engine.
type SharesSource interface {
	// Shares returns the latest window's figures; instances it does not
	// know are reported with their entitled compute only.
	Shares(ctx context.Context) ([]Share, error)
}

// ApplyRequest is one Apply call.
type ApplyRequest struct {
	// Name is the file name (format detection, messages); may be empty.
	Name   string
	Data   []byte
	Select string
	DryRun bool
}

// ApplyOutcome is what Apply reports: the change set and the result as
// JSON, and the changes as text for people.
type ApplyOutcome struct {
	Changes json.RawMessage
	Result  json.RawMessage
	Summary string
}

// Applier carries out declarative configuration (pkg/apply). Its errors
// wrap the manager's sentinels, like the manager's own.
type Applier interface {
	Apply(ctx context.Context, req ApplyRequest) (ApplyOutcome, error)
}

// NewApplier is the Applier of pkg/apply over m (*manager.Manager),
// within lim (the zero Limits are pkg/apply's defaults).
func NewApplier(m apply.Manager, lim apply.Limits) Applier { return applier{m: m, lim: lim} }

type applier struct {
	m   apply.Manager
	lim apply.Limits
}

func (a applier) Apply(ctx context.Context, req ApplyRequest) (ApplyOutcome, error) {
	name := req.Name
	if name == "" {
		name = "configuration"
	}
	d, err := apply.Parse(name, req.Data, req.Select)
	if err != nil {
		return ApplyOutcome{}, err
	}
	cs, err := apply.DiffWith(ctx, a.m, d, a.lim)
	if err != nil {
		return ApplyOutcome{}, err
	}
	changes, err := json.Marshal(cs)
	if err != nil {
		return ApplyOutcome{}, fmt.Errorf("encode change set: %w", err)
	}
	out := ApplyOutcome{Changes: changes, Summary: cs.String()}
	if req.DryRun {
		return out, nil
	}
	res, err := apply.ExecuteWith(ctx, a.m, cs, a.lim)
	if b, merr := json.Marshal(res); merr == nil {
		out.Result = b
	}
	if err != nil {
		return out, progressError(res, err)
	}
	return out, nil
}

// progressError words a failed Execute for the caller. A failed call's
// reply carries only the error, and the manager's message of it is the
// failed step's alone, so what was done and what was not goes into the
// message; the sentinel (the error name) stays Execute's.
func progressError(res apply.Result, err error) error {
	if res.Failed == nil {
		return err
	}
	total := len(res.Done) + 1 + res.Remaining
	// cause: the failed step's own error, for the daemon's log.
	return &apiError{kind: err, cause: errors.Unwrap(err), msg: fmt.Sprintf("apply stopped at change %d of %d (%s): %s. Done before it: %d; not attempted: %d. "+
		"The done changes stay; fix the cause and apply again (plan -f shows what remains)",
		len(res.Done)+1, total, res.Failed, res.Error, len(res.Done), res.Remaining)}
}
