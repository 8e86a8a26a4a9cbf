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
	// Retried are the failed or lost instances tried again because their
	// GPU changed since the last check (the VFs came back, MIG was turned
	// on again, the GPU reappeared).
	Retried []string
	// Foreign are the devices no record explains; those no earlier pass
	// had found were announced with EventDrift.
	Foreign []Foreign
	// SettingsLost are the GPUs whose heterogeneous mode or pinned
	// scheduler the driver no longer held (reset, VF rebind, driver
	// reload); the reconcile set them again.
	SettingsLost []string
	Reconcile    *ReconcileReport
}

// driftState remembers the foreign devices already reported, so each is
// announced once when it appears (and again if it goes and comes back).
type driftState struct {
	mu   sync.Mutex
	seen map[string]bool
	// prints is each GPU's hostPrint at the last check.
	prints map[string]string
	// settingsRefused is, per GPU whose lost settings a check's reconcile
	// tried and could not set again, the GPU's print then
	// (settingsWorthTrying).
	settingsRefused map[string]string
}

// changed records each GPU's print and says which GPUs' prints differ from
// the last check's (a GPU seen the first time has not changed).
func (s *driftState) changed(now map[string]string) map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for id, p := range now {
		if was, ok := s.prints[id]; ok && was != p {
			out[id] = true
		}
	}
	s.prints = now
	return out
}

// CheckDrift is the periodic discovery: it re-reads the whole host and
// compares every record at rest with it. Instances whose devices vanished
// without an event (a driver reload, a GPU reset, `nvidia-smi mig -dgi` by
// hand, a reboot the daemon outlived) are repaired at once by a reconcile
// under the usual policy: re-created at their placement or another legal
// one on their GPU, or marked lost when their GPU is gone. GPU settings
// the driver forgot (settingsLost) are set again by the same reconcile,
// before it re-creates instances. Each such
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
	var stuck []store.Instance
	for _, r := range recs {
		switch {
		case m.missing(r):
			suspects[r.GPUUUID] = append(suspects[r.GPUUUID], r)
		case (r.State == store.StateFailed || r.State == store.StateLost) && !m.inflight.busy(r.UUID):
			stuck = append(stuck, r)
		}
	}
	var rep DriftReport
	// Instances a reconcile could not bring back (failed: no VFs, MIG off,
	// a slot taken; lost: the GPU was gone) are tried again when their GPU
	// changed since the last check, and only then: what failed on a GPU
	// that did not change would fail again.
	prints := m.hostPrints(recs)
	changed := m.drift.changed(prints)
	for _, r := range stuck {
		if changed[r.GPUUUID] {
			rep.Retried = append(rep.Retried, r.UUID)
		}
	}
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
	// Settings the driver forgot (heterogeneous mode, a pinned scheduler)
	// are put back by the same pass, before it re-creates instances.
	lost, err := m.settingsLost(ctx)
	if err != nil {
		return rep, err
	}
	lost = m.drift.settingsWorthTrying(lost, prints)
	rep.SettingsLost = lost
	if len(rep.Missing) > 0 || len(rep.Retried) > 0 || len(lost) > 0 {
		if len(lost) > 0 {
			m.log.Warn("host drift: GPU settings lost (a GPU reset, VF rebind or driver reload); reconciling to set them again", "gpus", lost)
		}
		if len(rep.Missing) > 0 {
			m.log.Warn("host drift: instances' devices vanished without an event; reconciling", "instances", rep.Missing)
		}
		if len(rep.Retried) > 0 {
			m.log.Info("host changed under failed or lost instances; reconciling to bring them back", "instances", rep.Retried)
		}
		rec, err := m.Reconcile(withCause(ctx, CauseDrift))
		if err != nil {
			return rep, err
		}
		rep.Reconcile = &rec
		rep.Foreign = rec.Foreign
		m.announceMissing(rep.Missing, rec)
		// The reconcile may have changed the GPUs (re-created devices):
		// the next check compares with what they hold now.
		after := m.hostPrints(recs)
		m.drift.changed(after)
		if len(lost) > 0 {
			if still, err := m.settingsLost(ctx); err == nil {
				m.drift.noteSettingsRefused(lost, still, after)
			}
		}
		return rep, nil
	}
	// Devices made behind vgpud's back are reported without a repair
	// pass: nothing of vgpud's changed.
	rep.Foreign = m.foreign()
	return rep, nil
}

// missing reports whether a record at rest has devices are not all on the
// host as last read. Records an operation or intent is in charge of are
// not at rest.
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

// hostPrints sums up, per GPU, what decides whether a failed or lost
// instance can come back: whether the GPU answers, its MIG mode, its VFs
// and mdev parents, an XID failure. Instances on a GPU whose print
// changed are worth another try. A GPU that records name and the host
// lacks is "absent", so its coming back is a change too.
func (m *Manager) hostPrints(recs []store.Instance) map[string]string {
	m.invMu.RLock()
	defer m.invMu.RUnlock()
	out := make(map[string]string, len(m.inv.GPUs))
	for _, g := range m.inv.GPUs {
		out[g.UUID] = fmt.Sprintf("lost=%v mig=%v/%v vfs=%d mdev=%d failed=%q", g.Lost, g.MIG.Enabled, g.MIG.Pending,
			len(g.VGPU.VFs), len(g.VGPU.MdevParents), m.failedGPUs[g.UUID].Why)
	}
	for _, r := range recs {
		if _, ok := out[r.GPUUUID]; !ok {
			out[r.GPUUUID] = "absent"
		}
	}
	return out
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
