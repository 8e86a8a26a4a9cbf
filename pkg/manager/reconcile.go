package manager

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/vgpud/vgpud/pkg/store"
)

// ReconcileReport says what a reconcile pass found and did.
type ReconcileReport struct {
	Duration time.Duration `json:"durationNs"`
	// Finished and Undone are the intents rolled forward and back.
	Finished []string `json:"finished,omitempty"`
	Undone   []string `json:"undone,omitempty"`
	// Recreated are instances a reboot or GPU reset lost, carved again.
	Recreated []string `json:"recreated,omitempty"`
	// Lost are instances whose GPU is gone; Failed those vgpud could not restore.
	Lost   []string `json:"lost,omitempty"`
	Failed []string `json:"failed,omitempty"`
	// Foreign are devices vgpud did not create: left alone, counted against capacity.
	Foreign []Foreign `json:"foreign,omitempty"`
	// Attachments lists attachment records fixed to match libvirt.
	Attachments []string `json:"attachments,omitempty"`
	// Pending are intents left for a later pass (libvirt not connected, a
	// host call failing), each with why.
	Pending []string `json:"pending,omitempty"`
}

// Reconcile compares the records with the host: it finishes or undoes
// every intent a crash left, re-creates instances a reboot lost (at their
// recorded placement when it is free), marks instances whose GPU is gone
// lost, reports devices vgpud did not create, and checks attachments
// against libvirt. The host pass holds the admission lock (no request is
// admitted meanwhile); the libvirt pass runs after it, with its own
// deadline, so a slow libvirtd does not hold up carving.
func (m *Manager) Reconcile(ctx context.Context) (ReconcileReport, error) {
	done, err := m.begin()
	if err != nil {
		return ReconcileReport{}, err
	}
	defer done()
	start := time.Now()
	rep, err := m.reconcileHost(ctx)
	if err != nil {
		return rep, err
	}
	if v := m.lv(); v != nil {
		if why := libvirtAbsent(ctx, v); why != "" {
			// Answered now rather than at the pass's deadline: the libvirt
			// part runs again when libvirtd answers (vgpud reconciles on
			// every reconnection).
			m.log.Warn("reconcile: libvirt pass left pending", "why", why)
			rep.Pending = append(rep.Pending, "libvirt: "+why+"; attachments are checked when libvirtd answers again")
		} else {
			actx, cancel := context.WithTimeout(ctx, attachmentPassTimeout)
			m.reconcileAttachments(actx, &rep)
			cancel()
		}
	}
	rep.Duration = time.Since(start)
	m.log.Info("reconciled", "took", rep.Duration, "finished", len(rep.Finished), "undone", len(rep.Undone),
		"recreated", len(rep.Recreated), "lost", len(rep.Lost), "failed", len(rep.Failed), "foreign", len(rep.Foreign),
		"pending", len(rep.Pending))
	return rep, nil
}

// attachmentPassTimeout bounds reconcile's look at libvirt; libvirtProbe
// bounds the one call that first asks whether libvirtd answers at all (a
// libvirtd that is gone refuses at once, a hung one would hold every call
// of the pass to its own timeout).
const (
	attachmentPassTimeout = time.Minute
	libvirtProbe          = 3 * time.Second
)

// libvirtAbsent says why the libvirt pass cannot run now ("" when it can):
// a Virt that connects in the background and has not connected yet, or a
// libvirtd that does not answer a domain listing within libvirtProbe.
func libvirtAbsent(ctx context.Context, v Virt) string {
	if !virtReady(v) {
		return "not connected yet (vgpud keeps trying)"
	}
	pctx, cancel := context.WithTimeout(ctx, libvirtProbe)
	defer cancel()
	if _, err := v.Domains(pctx); err != nil {
		if pctx.Err() != nil && ctx.Err() == nil {
			return fmt.Sprintf("libvirtd did not answer within %v", libvirtProbe)
		}
		return "libvirtd unreachable: " + err.Error()
	}
	return ""
}

// reconcileHost is reconcile's host pass, under the admission lock: the
// intents a crash left are resolved (resolveIntent), every record is
// checked against the host (restore), and the devices no record explains
// are listed (foreign).
func (m *Manager) reconcileHost(ctx context.Context) (ReconcileReport, error) {
	m.admit.Lock()
	defer m.admit.Unlock()
	// Under the admission lock every create and destroy waits: leftover
	// destroys leave their fleet allocation to the fleet's next pass.
	ctx = settleLater(ctx)
	var rep ReconcileReport
	if err := m.loadGPUState(); err != nil {
		return rep, err
	}
	if err := m.canonicalRecords(); err != nil {
		return rep, err
	}
	if err := m.Refresh(ctx); err != nil {
		return rep, err
	}
	if err := m.applyVGPUModes(ctx, &rep); err != nil {
		return rep, err
	}
	if err := m.applySchedulers(ctx, &rep); err != nil {
		return rep, err
	}
	var intents []store.Intent
	if err := m.db.View(func(tx *store.Tx) (err error) { intents, err = tx.Intents(); return err }); err != nil {
		return rep, classify(err, "read intents")
	}
	// A create-and-attach, and a migration, are resolved once the create
	// (and attach) they span are.
	sort.SliceStable(intents, func(i, j int) bool { return !spans(intents[i].Op) && spans(intents[j].Op) })
	for _, it := range intents {
		if !m.inflight.take(it.ID, it.Instance) {
			continue // its operation is still running
		}
		err := m.resolveLeftover(ctx, it, &rep)
		m.inflight.done(it.ID)
		if err != nil {
			m.log.Warn("reconcile intent left for a later pass", "intent", it.ID, "op", it.Op, "instance", it.Instance, "err", err)
			rep.Pending = append(rep.Pending, fmt.Sprintf("%s of %s: %s", it.Op, it.Instance, Message(err)))
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			continue
		}
		m.crash(CrashReconcile)
	}
	var recs []store.Instance
	if err := m.db.View(func(tx *store.Tx) (err error) { recs, err = tx.Instances(); return err }); err != nil {
		return rep, classify(err, "read instances")
	}
	if err := m.restoreAll(ctx, recs, &rep); err != nil {
		return rep, err
	}
	for uuid := range m.dirty {
		m.refreshGPU(ctx, uuid)
		delete(m.dirty, uuid)
	}
	// GPU instances are back: their pinned schedulers, before VMs start.
	if err := m.applyGPUInstanceSchedulers(ctx, &rep); err != nil {
		return rep, err
	}
	rep.Foreign = m.foreign()
	return rep, nil
}

// spans: an operation of op spans others (a create, an attach), which
// reconcile resolves first.
func spans(op store.Op) bool {
	return op == store.OpCreateAttach || op == store.OpOutgoing || op == store.OpIncoming
}

// virtReady: a Virt that connects in the background says whether it is
// connected (the attachment check would otherwise wait for libvirtd).
func virtReady(v Virt) bool {
	r, ok := v.(interface{ Ready() bool })
	return !ok || r.Ready()
}
