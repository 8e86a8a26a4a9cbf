package health

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

// resync is the work a batch of events asks for.
type resync int

const (
	noResync  resync = iota
	refresh          // re-read the host
	reconcile        // re-read it and bring the records in line
)

// ask adds work to the batch.
func (w *Watcher) ask(r resync, why string) {
	now := w.now()
	if w.want == noResync {
		w.first = now
	}
	w.last = now
	w.want = max(w.want, r)
	w.reasons[why]++
	w.stats.Batched.Add(1)
}

// arm (re)sets the settle timer: quiet for UeventSettle after the last
// event, but no later than stormFactor settle periods after the first.
func (w *Watcher) arm(t *time.Timer) {
	if d, ok := w.settleIn(); ok {
		t.Reset(d)
	}
}

// settleIn is how long the batch waits before its re-read; false when
// there is no batch.
func (w *Watcher) settleIn() (time.Duration, bool) {
	if w.want == noResync {
		return 0, false
	}
	settle := w.settings().UeventSettle
	due := w.last.Add(settle)
	if latest := w.first.Add(stormFactor * settle); due.After(latest) {
		due = latest
	}
	return max(due.Sub(w.now()), 0), true
}

// resync runs the batch's work.
func (w *Watcher) resync(ctx context.Context) {
	want, reasons := w.want, w.reasons
	n := 0
	for _, c := range reasons {
		n += c
	}
	w.want, w.reasons = noResync, map[string]int{}
	defer w.stats.Batched.Add(-int64(n))
	if want == noResync {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	why := describe(reasons)
	if want == reconcile {
		w.stats.Reconciles.Add(1)
		rep, err := w.mgr.Reconcile(ctx)
		if err != nil {
			w.log.Warn("host changed: reconcile failed", "events", n, "why", why, "err", err)
		} else {
			w.log.Info("host changed: reconciled", "events", n, "why", why, "lost", len(rep.Lost), "recreated", len(rep.Recreated), "failed", len(rep.Failed))
		}
	} else {
		w.stats.Refreshes.Add(1)
		if err := w.mgr.Refresh(ctx); err != nil {
			w.log.Warn("host changed: re-read failed", "events", n, "why", why, "err", err)
		} else {
			w.log.Debug("host changed: re-read", "events", n, "why", why)
		}
	}
	w.reindex()
	w.noticeLost(want == reconcile)
	if len(w.failed) > 0 {
		w.probe(ctx)
	}
	w.status()
}

func describe(reasons map[string]int) string {
	keys := make([]string, 0, len(reasons))
	for k := range reasons {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s×%d", k, reasons[k])
	}
	return strings.Join(parts, ", ")
}
