package manager

import (
	"context"
	"fmt"
	"sync"

	"github.com/vgpud/vgpud/pkg/store"
)

// EventDrift: the host changed behind vgpud's back. ID is the instance
// whose devices vanished (Op "missing") or the GPU holding a device no
// record explains (Op "foreign"); Detail says what was found and done.
const EventDrift EventKind = "HostDrift"

// Drift ops, the values of Event.Op for EventDrift (metrics label them).
const (
	DriftMissing = "missing"
	DriftForeign = "foreign"
)

// DriftReport says what a drift check found; Reconcile is the repair pass
// it ran (nil when the records matched the host).
type DriftReport struct {
	// Missing are the instances whose devices the host no longer showed.
	Missing []string
	// Foreign are the devices no record explains; those no earlier pass
	// had found were announced with EventDrift.
	Foreign   []Foreign
	Reconcile *ReconcileReport
}

// driftState remembers the foreign devices already reported, so each is
// announced once when it appears (and again if it goes and comes back).
type driftState struct {
	mu   sync.Mutex
	seen map[string]bool
}

// CheckDrift is the periodic discovery: it re-reads the whole host and
// compares every settled record with it. Instances whose devices vanished
// without an event (a driver reload, a GPU reset, `nvidia-smi mig -dgi` by
// hand, a reboot the daemon outlived) are repaired at once by a reconcile
// under the usual policy: re-created at their placement or another legal
// one on their GPU, or marked lost when their GPU is gone. Each such
// instance, and each device no record explains, is announced with
// EventDrift.
func (m *Manager) CheckDrift(ctx context.Context) (DriftReport, error) {
	done, err := m.begin()
	if err != nil {
		return DriftReport{}, err
	}
	defer done()
	if err := m.Refresh(ctx); err != nil {
		return DriftReport{}, err
	}
	var recs []store.Instance
	if err := m.db.View(func(tx *store.Tx) (err error) { recs, err = tx.Instances(); return err }); err != nil {
		return DriftReport{}, classify(err, "read instances")
	}
	suspects := map[string][]store.Instance{}
	for _, r := range recs {
		if m.missing(r) {
			suspects[r.GPUUUID] = append(suspects[r.GPUUUID], r)
		}
	}
	var rep DriftReport
	for gpuUUID, rs := range suspects {
		// The full read may have begun before an operation finished with
		// this GPU: read it again, after the records were read, and
		// believe only what that read shows.
		m.refreshGPU(ctx, gpuUUID)
		for _, r := range rs {
			if m.missing(r) {
				rep.Missing = append(rep.Missing, r.UUID)
			}
		}
	}
	if len(rep.Missing) > 0 {
		m.log.Warn("host drift: instances' devices vanished without an event; reconciling", "instances", rep.Missing)
		rec, err := m.Reconcile(ctx)
		if err != nil {
			return rep, err
		}
		rep.Reconcile = &rec
		rep.Foreign = rec.Foreign
		m.announceMissing(rep.Missing, rec)
		return rep, nil
	}
	// Devices made behind vgpud's back are reported without a repair
	// pass: nothing of vgpud's changed.
	rep.Foreign = m.foreign()
	return rep, nil
}

// missing reports whether a settled record's devices are not all on the
// host as last read. Records an operation or intent is in charge of are
// not settled.
func (m *Manager) missing(r store.Instance) bool {
	if r.State != store.StateReady || m.inflight.busy(r.UUID) {
		return false
	}
	if g := m.hostGPU(r.GPUUUID); g == nil || g.Lost {
		return true
	}
	gi, ci, vg := m.present(&r) // r is a copy: present's fill-ins stay here
	return !complete(&r, gi, ci, vg)
}

// announceMissing emits EventDrift for each vanished instance with what the
// reconcile did about it.
func (m *Manager) announceMissing(ids []string, rec ReconcileReport) {
	outcome := map[string]string{}
	for _, id := range rec.Recreated {
		outcome[id] = "re-created"
	}
	for _, id := range rec.Lost {
		outcome[id] = "marked lost (its GPU is gone)"
	}
	for _, id := range rec.Failed {
		outcome[id] = "marked failed (could not be re-created)"
	}
	for _, id := range ids {
		did := outcome[id]
		if did == "" {
			did = "found whole again by the reconcile"
		}
		m.emit(Event{Kind: EventDrift, ID: id, Op: DriftMissing, Detail: "devices vanished from the host without an event: " + did})
	}
}

// noteForeign records the foreign devices a pass found and announces those
// not reported before. Called by every pass that lists them (foreign).
func (m *Manager) noteForeign(list []Foreign) {
	fresh := m.drift.note(list)
	for _, f := range fresh {
		m.log.Warn("host drift: a device no record explains (left alone, counted against capacity)", "gpu", f.GPU, "kind", f.Kind, "id", f.ID, "detail", f.Detail)
		m.emit(Event{Kind: EventDrift, ID: f.GPU, Op: DriftForeign, Detail: fmt.Sprintf("foreign %s %s: %s", f.Kind, f.ID, f.Detail)})
	}
}

// note replaces the set of foreign devices with list and returns those
// that are new.
func (s *driftState) note(list []Foreign) []Foreign {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := map[string]bool{}
	var fresh []Foreign
	for _, f := range list {
		k := f.GPU + "/" + string(f.Kind) + "/" + f.ID
		next[k] = true
		if !s.seen[k] {
			fresh = append(fresh, f)
		}
	}
	s.seen = next
	return fresh
}
