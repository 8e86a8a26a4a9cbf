package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/virt"
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

// Foreign is one device on the host that no record explains.
type Foreign struct {
	GPU    string `json:"gpu"`
	Kind   string `json:"kind"` // gpu-instance, vf, mdev
	ID     string `json:"id"`
	Detail string `json:"detail,omitempty"`
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
	if v := m.lv(); v != nil && virtReady(v) {
		actx, cancel := context.WithTimeout(ctx, attachmentPassTimeout)
		m.reconcileAttachments(actx, &rep)
		cancel()
	}
	rep.Duration = time.Since(start)
	m.log.Info("reconciled", "took", rep.Duration, "finished", len(rep.Finished), "undone", len(rep.Undone),
		"recreated", len(rep.Recreated), "lost", len(rep.Lost), "failed", len(rep.Failed), "foreign", len(rep.Foreign),
		"pending", len(rep.Pending))
	return rep, nil
}

// attachmentPassTimeout bounds reconcile's look at libvirt.
const attachmentPassTimeout = time.Minute

func (m *Manager) reconcileHost(ctx context.Context) (ReconcileReport, error) {
	m.admit.Lock()
	defer m.admit.Unlock()
	var rep ReconcileReport
	if err := m.loadGPUState(); err != nil {
		return rep, err
	}
	if err := m.Refresh(ctx); err != nil {
		return rep, err
	}
	if err := m.applyVGPUModes(ctx, &rep); err != nil {
		return rep, err
	}
	var intents []store.Intent
	if err := m.db.View(func(tx *store.Tx) (err error) { intents, err = tx.Intents(); return err }); err != nil {
		return rep, classify(err, "read intents")
	}
	// A create-and-attach is settled once its create and attach are.
	sort.SliceStable(intents, func(i, j int) bool {
		return intents[i].Op != store.OpCreateAttach && intents[j].Op == store.OpCreateAttach
	})
	for _, it := range intents {
		if !m.live.claim(it.ID, it.Instance) {
			continue // its operation is still running
		}
		err := m.resolveLeftover(ctx, it, &rep)
		m.live.done(it.ID)
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
	for i := range recs {
		if m.live.busy(recs[i].UUID) {
			continue // an operation in flight owns it
		}
		if err := m.restore(ctx, &recs[i], &rep); err != nil && ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	for uuid := range m.dirty {
		m.refreshGPU(ctx, uuid)
		delete(m.dirty, uuid)
	}
	rep.Foreign = m.foreign()
	return rep, nil
}

// hostGI finds the GPU instance of a record on the host (by placement and
// profile: ids change across reboots).
func hostGI(g *gpu.GPU, r *store.Instance) *gpu.GPUInstance {
	for i := range g.MIG.Instances {
		gi := &g.MIG.Instances[i]
		if gi.Placement.Start == r.GIStart && gi.ProfileID == r.GIProfileID {
			return gi
		}
	}
	return nil
}

func (m *Manager) hostGPU(uuid string) *gpu.GPU {
	inv := m.Inventory()
	for i := range inv.GPUs {
		if inv.GPUs[i].UUID == uuid {
			return &inv.GPUs[i]
		}
	}
	return nil
}

// present reports which parts of a record the host shows, filling in the
// driver's ids (a crash may come between a host call and its record).
func (m *Manager) present(r *store.Instance) (gi, ci, vg bool) {
	g := m.hostGPU(r.GPUUUID)
	if g == nil || g.Lost {
		return
	}
	if r.Kind == store.KindMIG || r.Kind == store.KindMIGVGPU {
		if x := hostGI(g, r); x != nil {
			gi = true
			r.GIID = x.ID
			for _, c := range x.Compute {
				if r.CIID < 0 || c.ID == r.CIID {
					ci, r.CIID, r.CIProfileID = true, c.ID, c.ProfileID
				}
			}
		}
	}
	switch {
	case r.Flow == store.FlowVFIO:
		for _, vf := range g.VGPU.VFs {
			if vf.PCI == r.VF && vf.Type == r.TypeID {
				vg = true
			}
		}
	case r.Flow == store.FlowMdev:
		for _, md := range g.VGPU.Mdevs {
			if md.UUID == r.MdevUUID {
				vg = true
			}
		}
	}
	return gi, ci, vg
}

func complete(r *store.Instance, gi, ci, vg bool) bool {
	switch r.Kind {
	case store.KindMIG:
		return gi && ci
	case store.KindMIGVGPU:
		return gi && vg
	case store.KindVGPU:
		return vg
	}
	return true
}

// resolveLeftover resolves a claimed intent if it is still on disk: one
// that is gone was completed by its operation after Intents was read.
func (m *Manager) resolveLeftover(ctx context.Context, it store.Intent, rep *ReconcileReport) error {
	err := m.db.View(func(tx *store.Tx) error { _, err := tx.Intent(it.ID); return err })
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return m.resolveIntent(ctx, it, rep)
}

func (m *Manager) resolveIntent(ctx context.Context, it store.Intent, rep *ReconcileReport) error {
	var rec store.Instance
	err := m.db.View(func(tx *store.Tx) (err error) { rec, err = tx.Instance(it.Instance); return err })
	missing := errors.Is(err, store.ErrNotFound)
	if err != nil && !missing {
		return err
	}
	dropIntent := func() error { return m.db.Update(func(tx *store.Tx) error { return tx.DeleteIntent(it.ID) }) }
	switch it.Op {
	case store.OpCreate:
		if missing {
			return dropIntent()
		}
		gi, ci, vg := m.present(&rec)
		if complete(&rec, gi, ci, vg) {
			rec.State, rec.Updated = store.StateReady, m.now()
			if err := m.db.Update(func(tx *store.Tx) error {
				if err := tx.PutInstance(&rec); err != nil {
					return err
				}
				return tx.DeleteIntent(it.ID)
			}); err != nil {
				return err
			}
			rep.Finished = append(rep.Finished, rec.UUID)
			m.emit(Event{Kind: EventInstanceAdded, ID: rec.UUID})
			return nil
		}
		parts := map[string]bool{"gi": gi, "ci": ci, "vgpu": vg}
		if err := m.release(ctx, &rec, func(s string) bool { return parts[s] }, false); err != nil {
			return err
		}
		m.refreshGPU(ctx, rec.GPUUUID)
		if err := m.db.Update(func(tx *store.Tx) error {
			if err := tx.DeleteInstance(rec.UUID); err != nil {
				return err
			}
			return tx.DeleteIntent(it.ID)
		}); err != nil {
			return err
		}
		rep.Undone = append(rep.Undone, rec.UUID)
		return nil
	case store.OpDestroy:
		if missing {
			return dropIntent()
		}
		m.present(&rec)
		if err := m.finishDestroy(ctx, rec, it.ID, it.Started); err != nil {
			return err
		}
		rep.Finished = append(rep.Finished, rec.UUID)
		return nil
	case store.OpAttach, store.OpDetach:
		var p attachPayload
		_ = json.Unmarshal(it.Payload, &p)
		if v := m.lv(); v != nil && !virtReady(v) {
			// Settled once libvirt is connected (it reconciles again).
			return fail(ErrBusy, nil, "libvirt is not connected yet")
		}
		if !missing && m.lv() != nil && p.Domain != "" {
			if err := m.settleAttach(ctx, rec, p, it.Op == store.OpAttach); err != nil {
				return err
			}
		}
		if err := dropIntent(); err != nil {
			return err
		}
		rep.Finished = append(rep.Finished, it.Instance)
		return nil
	case store.OpMove:
		if missing {
			return dropIntent()
		}
		if err := m.clearOtherPlacement(ctx, rec, it.Payload); err != nil {
			return err
		}
		if err := dropIntent(); err != nil {
			return err
		}
		// restore (later in this pass) carves whatever the record's own
		// placement lacks.
		rep.Finished = append(rep.Finished, rec.UUID)
		return nil
	case store.OpCreateAttach:
		return m.resolveCreateAttach(ctx, it, rec, missing, rep)
	}
	return dropIntent()
}

// clearOtherPlacement settles a move a crash interrupted: the record names
// the placement it holds (old or new), and whatever the host shows at the
// other one, unless another record explains it, is taken away.
func (m *Manager) clearOtherPlacement(ctx context.Context, rec store.Instance, payload []byte) error {
	var p movePayload
	if err := json.Unmarshal(payload, &p); err != nil {
		return fmt.Errorf("move plan of %s: %w", rec.UUID, err)
	}
	other := rec
	if rec.GPUUUID == p.ToGPU && rec.GIStart == p.ToStart {
		other.GPUUUID, other.GPUPCI, other.GIStart, other.VF = p.FromGPU, p.FromPCI, p.FromStart, p.FromVF
	} else {
		other.GPUUUID, other.GPUPCI, other.GIStart, other.VF = p.ToGPU, p.ToPCI, p.ToStart, p.ToVF
	}
	other.GIID, other.CIID = -1, -1
	g := m.hostGPU(other.GPUUUID)
	if g == nil || g.Lost {
		return nil // nothing to take away there
	}
	gi, ci, vg := m.present(&other)
	var s *snapshot
	if err := m.db.View(func(tx *store.Tx) (err error) { s, err = m.snapshot(tx); return err }); err != nil {
		return err
	}
	for _, r := range s.giRecords(other.GPUUUID, other.GIStart, other.GIProfileID) {
		if r.UUID != rec.UUID {
			gi, ci = false, false // another record's GPU instance
		}
	}
	for _, r := range s.byGPU[other.GPUUUID] {
		if other.VF != "" && r.VF == other.VF {
			vg = false // the record's own VF, or another record's
		}
	}
	if other.Flow == store.FlowMdev {
		vg = false // an mdev keeps its UUID: it is the record's own
	}
	if !gi && !ci && !vg {
		return nil
	}
	l := m.gpuLock(other.GPUUUID)
	l.Lock()
	defer l.Unlock()
	parts := map[string]bool{"gi": gi, "ci": ci, "vgpu": vg}
	m.dirty[other.GPUUUID] = true
	return m.release(ctx, &other, func(s string) bool { return parts[s] }, false)
}

// resolveCreateAttach settles a create-and-attach a crash interrupted (its
// create and attach intents, resolved first, settled each half): an
// instance it made that is not attached is destroyed, as the call would
// have done.
func (m *Manager) resolveCreateAttach(ctx context.Context, it store.Intent, rec store.Instance, missing bool, rep *ReconcileReport) error {
	dropIntent := func() error { return m.db.Update(func(tx *store.Tx) error { return tx.DeleteIntent(it.ID) }) }
	if missing {
		return dropIntent()
	}
	attached := false
	var destroy string
	err := m.db.Update(func(tx *store.Tx) error {
		if _, err := tx.Attachment(rec.UUID); err == nil {
			attached = true
			return tx.DeleteIntent(it.ID)
		}
		r, err := tx.Instance(rec.UUID)
		if err != nil {
			return err
		}
		r.State, r.Updated = store.StateDestroying, m.now()
		if err := tx.PutInstance(&r); err != nil {
			return err
		}
		destroy = uuid.NewString()
		if err := tx.PutIntent(store.Intent{ID: destroy, Op: store.OpDestroy, Instance: r.UUID, Started: m.now()}); err != nil {
			return err
		}
		return tx.DeleteIntent(it.ID)
	})
	if err != nil || attached {
		return err
	}
	if err := m.finishDestroy(ctx, rec, destroy, it.Started); err != nil {
		return err
	}
	rep.Undone = append(rep.Undone, rec.UUID)
	return nil
}

// settleAttach finishes an attach (record what libvirt holds) or a detach
// (remove it from libvirt and the record) that a crash interrupted.
func (m *Manager) settleAttach(ctx context.Context, rec store.Instance, p attachPayload, attach bool) error {
	h, err := m.hostdevOf(rec, p.Display, p.RamFB)
	if err != nil {
		return err
	}
	dom, err := m.lv().Domain(ctx, p.Domain)
	if errors.Is(err, virt.ErrDomainNotFound) {
		return m.db.Update(func(tx *store.Tx) error { return tx.DeleteAttachment(rec.UUID) })
	}
	if err != nil {
		return err
	}
	if !attach {
		if err := m.lv().Detach(ctx, dom.Name, h, rec.UUID); err != nil {
			return err
		}
		return m.db.Update(func(tx *store.Tx) error { return tx.DeleteAttachment(rec.UUID) })
	}
	held, err := m.lv().Attached(ctx, dom.Name)
	if err != nil {
		return err
	}
	for _, a := range held {
		if a.Config && sameDevice(a.Hostdev, h) {
			if !a.MetadataConfig || a.Instance != rec.UUID {
				// Attach again (idempotent): it writes the metadata entry
				// an interrupted attach may lack.
				if _, err := m.lv().Attach(ctx, dom.Name, h, rec.UUID); err != nil {
					return err
				}
			}
			return m.db.Update(func(tx *store.Tx) error {
				return tx.PutAttachment(store.Attachment{Instance: rec.UUID, Domain: dom.Name, DomainUUID: dom.UUID, URI: m.lv().URI(), Live: a.Live, Created: m.now()})
			})
		}
	}
	// The attach never reached the config: clear any metadata it left.
	return m.lv().Detach(ctx, dom.Name, h, rec.UUID)
}

func sameDevice(a, b virt.Hostdev) bool {
	if a.Kind != b.Kind {
		return false
	}
	if a.Kind == virt.Mdev {
		return a.MdevUUID == b.MdevUUID
	}
	return a.PCI == b.PCI
}

// restore brings one record's devices back on the host if they are gone.
func (m *Manager) restore(ctx context.Context, r *store.Instance, rep *ReconcileReport) error {
	if r.State == store.StateCreating || r.State == store.StateDestroying {
		return nil // an intent is in charge (or was just resolved)
	}
	g := m.hostGPU(r.GPUUUID)
	if g == nil || g.Lost {
		if r.State != store.StateLost {
			r.State, r.Reason, r.Updated = store.StateLost, "GPU is gone from the host (lost or removed)", m.now()
			_ = m.db.Update(func(tx *store.Tx) error { return tx.PutInstance(r) })
			m.emit(Event{Kind: EventInstanceChanged, ID: r.UUID})
		}
		rep.Lost = append(rep.Lost, r.UUID)
		return nil
	}
	m.invMu.RLock()
	why := m.failedGPUs[r.GPUUUID].Why
	m.invMu.RUnlock()
	if why != "" {
		// A critical XID on a GPU that still answers: its instances are
		// failed until the GPU is cleared (MarkGPUFailed(uuid, "")).
		reason := "GPU failed: " + why
		if r.State != store.StateFailed || r.Reason != reason {
			r.State, r.Reason, r.Updated = store.StateFailed, reason, m.now()
			if err := m.db.Update(func(tx *store.Tx) error { return tx.PutInstance(r) }); err != nil {
				return err
			}
			m.emit(Event{Kind: EventInstanceChanged, ID: r.UUID})
		}
		rep.Failed = append(rep.Failed, r.UUID)
		return nil
	}
	before := *r
	gi, ci, vg := m.present(r)
	if complete(r, gi, ci, vg) {
		if r.State != store.StateReady || *r != before {
			r.State, r.Reason, r.Updated = store.StateReady, "", m.now()
			if err := m.db.Update(func(tx *store.Tx) error { return tx.PutInstance(r) }); err != nil {
				return err
			}
			m.emit(Event{Kind: EventInstanceChanged, ID: r.UUID})
		}
		return nil
	}
	l := m.gpuLock(r.GPUUUID)
	l.Lock()
	err := m.recreate(ctx, r, g, gi, ci)
	l.Unlock()
	// The GPU is re-read once at the end of the pass, not per instance: the
	// records already hold the devices this pass hands out.
	m.dirty[r.GPUUUID] = true
	if err != nil {
		r.State, r.Reason, r.Updated = store.StateFailed, Message(classify(err, "re-create")), m.now()
		_ = m.db.Update(func(tx *store.Tx) error { return tx.PutInstance(r) })
		rep.Failed = append(rep.Failed, r.UUID)
		m.log.Warn("could not re-create instance", "instance", r.UUID, "gpu", r.GPUPCI, "err", err)
		m.emit(Event{Kind: EventInstanceChanged, ID: r.UUID})
		return err
	}
	r.State, r.Reason = store.StateReady, ""
	if *r != before {
		r.Updated = m.now()
		if err := m.db.Update(func(tx *store.Tx) error { return tx.PutInstance(r) }); err != nil {
			return err
		}
	}
	rep.Recreated = append(rep.Recreated, r.UUID)
	m.log.Info("re-created instance", "instance", r.UUID, "gpu", r.GPUPCI, "gi", r.GIID, "vf", r.VF, "mdev", r.MdevUUID)
	m.emit(Event{Kind: EventInstanceChanged, ID: r.UUID})
	return nil
}

// recreate carves a record's missing parts again, at its recorded
// placement and device when they are free, else at the next legal one on
// the same GPU (the record is updated).
func (m *Manager) recreate(ctx context.Context, r *store.Instance, g *gpu.GPU, gi, ci bool) error {
	if (r.Kind == store.KindMIG || r.Kind == store.KindMIGVGPU) && !gi {
		if !g.MIG.Enabled {
			return fail(ErrBusy, nil, "MIG mode is off on GPU %s; enable it to bring back %s", g.PCI, r.UUID)
		}
		if err := m.moveIfTaken(r, g); err != nil {
			return err
		}
		x, err := m.mig.CreateGPUInstance(ctx, r.GPUUUID, r.GIProfileID, r.GIStart)
		if err != nil {
			return err
		}
		r.GIID, r.CIID = x.ID, -1
		// Other records on this GPU instance (several vGPUs per GI) find it
		// in the inventory.
		m.refreshGPU(ctx, r.GPUUUID)
	}
	if r.Kind == store.KindMIG && (!gi || !ci) {
		c, err := m.mig.CreateComputeInstance(ctx, r.GPUUUID, r.GIID, -1)
		if err != nil {
			return err
		}
		r.CIID, r.CIProfileID = c.ID, c.ProfileID
	}
	if r.Kind == store.KindVGPU || r.Kind == store.KindMIGVGPU {
		_, _, vg := m.present(r)
		if !vg {
			if err := m.pickDevice(r, g); err != nil {
				return err
			}
			if err := m.createVGPU(ctx, r); err != nil {
				return err
			}
			if r.Kind == store.KindMIGVGPU {
				if err := m.checkGI(ctx, r); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// moveIfTaken moves a lost GPU instance's recorded start when something
// else now covers it.
func (m *Manager) moveIfTaken(r *store.Instance, g *gpu.GPU) error {
	want := gpu.Range{Start: r.GIStart, Size: r.GISize}
	taken := false
	for _, x := range g.MIG.Instances {
		if x.Placement.Overlaps(want) {
			taken = true
		}
	}
	if !taken {
		return nil
	}
	var s *snapshot
	if err := m.db.View(func(tx *store.Tx) (err error) { s, err = m.snapshot(tx); return err }); err != nil {
		return err
	}
	// Free the record's own slot in the view, then ask placement.
	others := s.recs[:0]
	for _, x := range s.recs {
		if x.UUID != r.UUID {
			others = append(others, x)
		}
	}
	s.recs = others
	s.byGPU[r.GPUUUID] = nil
	for i := range s.recs {
		if s.recs[i].GPUUUID == r.GPUUUID {
			s.byGPU[r.GPUUUID] = append(s.byGPU[r.GPUUUID], &s.recs[i])
		}
	}
	md, _ := m.catalog().Model(r.Model)
	p, ok := md.GPUInstanceProfileByID(r.GIProfileID)
	if !ok {
		return fail(ErrBackendFailure, nil, "GPU model %s lost profile %d from the catalog", r.Model, r.GIProfileID)
	}
	d, err := placement.Place(m.migFleet(s), placement.Request{Profile: p.Name, GPU: r.GPUUUID})
	if err != nil {
		return classify(err, "slot %d of GPU %s is taken by a device vgpud did not create", r.GIStart, g.PCI)
	}
	m.log.Warn("recorded slot taken; re-creating elsewhere on the GPU", "instance", r.UUID, "from", r.GIStart, "to", d.Start)
	r.GIStart = d.Start
	return nil
}

// pickDevice keeps the recorded VF or mdev parent when it is free, else
// picks another free one on the same GPU.
func (m *Manager) pickDevice(r *store.Instance, g *gpu.GPU) error {
	switch r.Flow {
	case store.FlowVFIO:
		for _, vf := range g.VGPU.VFs {
			if vf.PCI == r.VF {
				if vf.Type == 0 {
					return nil
				}
				break
			}
		}
		var s *snapshot
		if err := m.db.View(func(tx *store.Tx) (err error) { s, err = m.snapshot(tx); return err }); err != nil {
			return err
		}
		gg := m.gpuOf(s, g.UUID)
		held := r.VF
		r.VF = ""
		for i := range s.recs {
			if s.recs[i].UUID == r.UUID {
				s.recs[i].VF = ""
			}
		}
		vf, ok := s.freeVF(gg)
		if !ok {
			r.VF = held
			if len(g.VGPU.VFs) == 0 {
				return fail(ErrBusy, nil, "GPU %s has no SR-IOV VFs enabled; run `sriov-manage -e %s`", g.PCI, g.PCI)
			}
			return fail(ErrNoCapacity, nil, "no free VF left on GPU %s", g.PCI)
		}
		m.log.Warn("recorded VF not usable; using another", "instance", r.UUID, "from", held, "to", vf)
		r.VF = vf
	case store.FlowMdev:
		for _, p := range g.VGPU.MdevParents {
			if p.PCI == r.MdevParent {
				return nil
			}
		}
		if len(g.VGPU.MdevParents) == 0 {
			return fail(ErrBusy, nil, "GPU %s shows no mdev types yet (the vGPU manager has not published them)", g.PCI)
		}
		var s *snapshot
		if err := m.db.View(func(tx *store.Tx) (err error) { s, err = m.snapshot(tx); return err }); err != nil {
			return err
		}
		parent, ok := s.freeMdevParent(m.gpuOf(s, g.UUID), r.TypeID)
		if !ok {
			return fail(ErrNoCapacity, nil, "no free mdev parent left on GPU %s", g.PCI)
		}
		r.MdevParent = parent
	}
	return nil
}

// reconcileAttachments drops attachment records of VMs that are gone or no
// longer hold the device (a VM undefined while vgpud did not watch gets the
// undefine policy), re-points VMs whose device moved, and keeps each
// record's live flag true to the VM.
func (m *Manager) reconcileAttachments(ctx context.Context, rep *ReconcileReport) {
	var atts []store.Attachment
	var recs map[string]store.Instance
	_ = m.db.View(func(tx *store.Tx) error {
		var err error
		if atts, err = tx.Attachments(); err != nil {
			return err
		}
		all, err := tx.Instances()
		recs = map[string]store.Instance{}
		for _, r := range all {
			recs[r.UUID] = r
		}
		return err
	})
	m.confMu.RLock()
	policy := m.undefinePolicy
	m.confMu.RUnlock()
	var release []string
	// forget drops an attachment unless an operation took the instance
	// meanwhile (it settles the record itself).
	forget := func(a store.Attachment, why string) bool {
		if m.live.busy(a.Instance) {
			return false
		}
		if err := m.db.Update(func(tx *store.Tx) error { return tx.DeleteAttachment(a.Instance) }); err != nil {
			m.log.Warn("forget attachment", "instance", a.Instance, "vm", a.Domain, "err", err)
			return false
		}
		rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: %s", a.Instance, why))
		m.emit(Event{Kind: EventInstanceChanged, ID: a.Instance})
		return true
	}
	for _, a := range atts {
		if m.live.busy(a.Instance) {
			continue // an attach or detach in flight settles it
		}
		if ctx.Err() != nil {
			rep.Pending = append(rep.Pending, "attachments: libvirt pass ran out of time")
			break
		}
		r := recs[a.Instance]
		h, err := m.hostdevOf(r, false, false)
		if err != nil {
			continue
		}
		held, err := m.lv().Attached(ctx, a.Domain)
		if errors.Is(err, virt.ErrDomainNotFound) {
			if forget(a, fmt.Sprintf("VM %s is gone", a.Domain)) && policy == "release" {
				release = append(release, a.Instance)
			}
			continue
		}
		if err != nil {
			m.log.Warn("read VM devices", "vm", a.Domain, "err", err)
			continue
		}
		found, live, meta, stale := false, false, false, []virt.Hostdev{}
		for _, x := range held {
			switch {
			case x.Config && sameDevice(x.Hostdev, h):
				found, live, meta = true, x.Live, x.MetadataConfig && x.Instance == a.Instance
			case x.Instance == a.Instance && x.Config:
				stale = append(stale, x.Hostdev)
			}
		}
		if found {
			if !meta {
				// The device is there without vgpud's metadata entry (an
				// attach interrupted by an older vgpud): write it.
				if _, err := m.lv().Attach(ctx, a.Domain, h, a.Instance); err != nil {
					m.log.Warn("restore vgpud metadata of VM", "vm", a.Domain, "instance", a.Instance, "err", err)
				} else {
					rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: VM %s metadata restored", a.Instance, a.Domain))
				}
			}
			if live != a.Live {
				m.setLive(a, live)
			}
			continue
		}
		if len(stale) > 0 {
			// The device moved (another VF after a reboot): re-point the VM.
			for _, old := range stale {
				_ = m.lv().Detach(ctx, a.Domain, old, a.Instance)
			}
			if _, err := m.lv().Attach(ctx, a.Domain, h, a.Instance); err != nil {
				m.log.Warn("re-point VM at moved device", "vm", a.Domain, "instance", a.Instance, "err", err)
				continue
			}
			rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: VM %s re-pointed", a.Instance, a.Domain))
			continue
		}
		forget(a, fmt.Sprintf("VM %s no longer holds it", a.Domain))
	}
	m.reconcileDomains(ctx, rep)
	for _, id := range release {
		if err := m.Destroy(ctx, id, DestroyOptions{}); err != nil && !errors.Is(err, ErrNotFound) {
			m.log.Warn("release instance of a VM undefined while vgpud did not watch", "instance", id, "err", err)
			rep.Pending = append(rep.Pending, fmt.Sprintf("release %s: %s", id, Message(err)))
			continue
		}
		m.log.Info("released instance of a VM undefined while vgpud did not watch", "instance", id)
	}
}

// reconcileDomains looks from libvirt's side: vgpud metadata in a domain
// that no attachment record explains. A VM whose config holds the device of
// an instance with no attachment record (the record was lost) gets the
// record back; a stopped VM that names an instance vgpud no longer has is
// cleared of it (the device is gone, and the VM would not start); anything
// else is reported, not touched.
func (m *Manager) reconcileDomains(ctx context.Context, rep *ReconcileReport) {
	doms, err := m.lv().Domains(ctx)
	if err != nil {
		m.log.Warn("list VMs", "err", err)
		return
	}
	// Read after the forward pass, which changed records; operations that
	// end meanwhile are checked again before anything is taken away.
	atts := map[string]store.Attachment{}
	recs := map[string]store.Instance{}
	if err := m.db.View(func(tx *store.Tx) error {
		all, err := tx.Attachments()
		if err != nil {
			return err
		}
		for _, a := range all {
			atts[a.Instance] = a
		}
		rs, err := tx.Instances()
		for _, r := range rs {
			recs[r.UUID] = r
		}
		return err
	}); err != nil {
		m.log.Warn("read attachments", "err", err)
		return
	}
	for _, d := range doms {
		if ctx.Err() != nil {
			rep.Pending = append(rep.Pending, "VMs: libvirt pass ran out of time")
			return
		}
		// The devices vgpud's records give this VM: never taken away here,
		// whatever stale metadata names them.
		var mine []virt.Hostdev
		for id, a := range atts {
			if a.DomainUUID == d.UUID || a.Domain == d.Name {
				if h, err := m.hostdevOf(recs[id], false, false); err == nil {
					mine = append(mine, h)
				}
			}
		}
		held, err := m.lv().Attached(ctx, d.Name)
		if err != nil {
			if !errors.Is(err, virt.ErrDomainNotFound) {
				m.log.Warn("read VM devices", "vm", d.Name, "err", err)
			}
			continue
		}
		for _, x := range held {
			if x.Instance == "" || m.live.busy(x.Instance) {
				continue
			}
			a, attached := atts[x.Instance]
			if attached && (a.DomainUUID == d.UUID || a.Domain == d.Name) {
				continue // the forward pass checked it
			}
			r, exists := recs[x.Instance]
			switch {
			case exists && !attached && x.Config:
				h, err := m.hostdevOf(r, false, false)
				if err != nil || !sameDevice(h, x.Hostdev) {
					rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: VM %s names it with another device; left alone", x.Instance, d.Name))
					continue
				}
				a := store.Attachment{Instance: r.UUID, Domain: d.Name, DomainUUID: d.UUID, URI: m.lv().URI(), Live: x.Live, Created: m.now()}
				if err := m.db.Update(func(tx *store.Tx) error { return tx.PutAttachment(a) }); err != nil {
					m.log.Warn("record attachment found in VM", "vm", d.Name, "instance", r.UUID, "err", err)
					continue
				}
				atts[r.UUID] = a
				rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: VM %s holds it; attachment recorded", r.UUID, d.Name))
				m.emit(Event{Kind: EventInstanceChanged, ID: r.UUID})
			case !exists && slices.ContainsFunc(mine, func(h virt.Hostdev) bool { return sameDevice(h, x.Hostdev) }):
				rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: gone; VM %s names it on a device another instance holds; left alone", x.Instance, d.Name))
			case !exists:
				// Only while nothing else runs: an attach in flight may be
				// giving this very device to another instance.
				if _, err := m.Instance(x.Instance); !(errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalidArgument)) || !m.live.idle() {
					continue
				}
				dom, err := m.lv().Domain(ctx, d.Name)
				if err != nil || dom.Running {
					rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: running VM %s names an instance vgpud does not have; left alone", x.Instance, d.Name))
					continue
				}
				if err := m.lv().Detach(ctx, d.Name, x.Hostdev, x.Instance); err != nil {
					m.log.Warn("clear a gone instance from VM", "vm", d.Name, "instance", x.Instance, "err", err)
					continue
				}
				rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: gone; cleared from VM %s", x.Instance, d.Name))
			default:
				rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: VM %s names it, but vgpud has it attached to %s; left alone", x.Instance, d.Name, a.Domain))
			}
		}
	}
}

// setLive records whether an attachment is live in its running VM.
func (m *Manager) setLive(a store.Attachment, live bool) {
	err := m.db.Update(func(tx *store.Tx) error {
		cur, err := tx.Attachment(a.Instance)
		if err != nil || cur.Domain != a.Domain {
			return err
		}
		cur.Live = live
		return tx.PutAttachment(cur)
	})
	if err != nil {
		m.log.Warn("record live state of attachment", "instance", a.Instance, "vm", a.Domain, "err", err)
		return
	}
	m.emit(Event{Kind: EventInstanceChanged, ID: a.Instance})
}

// foreign lists devices no record explains.
func (m *Manager) foreign() []Foreign {
	var s *snapshot
	if err := m.db.View(func(tx *store.Tx) (err error) { s, err = m.snapshot(tx); return err }); err != nil {
		return nil
	}
	var out []Foreign
	for i := range s.inv.GPUs {
		g := &s.inv.GPUs[i]
		for _, gi := range g.MIG.Instances {
			if len(s.giRecords(g.UUID, gi.Placement.Start, gi.ProfileID)) == 0 {
				out = append(out, Foreign{GPU: g.PCI, Kind: "gpu-instance", ID: fmt.Sprint(gi.ID),
					Detail: fmt.Sprintf("profile %d at %d+%d", gi.ProfileID, gi.Placement.Start, gi.Placement.Size)})
			}
		}
		md, _ := m.catalog().Model(g.Model)
		if md == nil {
			continue
		}
		for _, d := range s.devices(g, md) {
			if d.rec != nil {
				continue
			}
			name := "unknown type"
			if d.typ != nil {
				name = d.typ.Name
			}
			if d.vf != "" {
				out = append(out, Foreign{GPU: g.PCI, Kind: "vf", ID: d.vf, Detail: name})
			} else if d.mdev != "" {
				out = append(out, Foreign{GPU: g.PCI, Kind: "mdev", ID: d.mdev, Detail: name})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GPU+out[i].ID < out[j].GPU+out[j].ID })
	return out
}

// virtReady: a Virt that connects in the background says whether it is
// connected (the attachment check would otherwise wait for libvirtd).
func virtReady(v Virt) bool {
	r, ok := v.(interface{ Ready() bool })
	return !ok || r.Ready()
}
