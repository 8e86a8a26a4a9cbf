package manager

import (
	"context"
	"strings"
	"sync"
)

// PlacementOutcome collects, for one operation, the Placement promises it
// could not keep although the operation itself succeeded: a local create
// whose allocation was not written before carving (Placement did not
// answer in time; the sync writes it later), or a create or destroy whose
// GPU's part of Placement was not brought up to date before returning
// (left to the sync's next pass). The caller is told, so that a scheduler
// that reads Placement right after the reply knows it may see the old
// room.
type PlacementOutcome struct {
	mu     sync.Mutex
	behind []string
}

type outcomeKey struct{}

// WithPlacementOutcome returns a context whose operations note in the
// returned outcome what they left Placement behind on.
func WithPlacementOutcome(ctx context.Context) (context.Context, *PlacementOutcome) {
	o := &PlacementOutcome{}
	return context.WithValue(ctx, outcomeKey{}, o), o
}

// Behind says what Placement was left behind on, "" when nothing: every
// promise was kept (or no fleet is configured).
func (o *PlacementOutcome) Behind() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.Join(o.behind, "; ")
}

// notePlacementBehind records in ctx's outcome, if it has one, what an
// operation left to the sync.
func notePlacementBehind(ctx context.Context, what string) {
	o, _ := ctx.Value(outcomeKey{}).(*PlacementOutcome)
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.behind = append(o.behind, what)
}
