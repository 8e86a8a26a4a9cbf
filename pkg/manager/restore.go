package manager

import (
	"context"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/store"
)

// restore brings one record's devices back on the host if they are gone.
func (m *Manager) restore(ctx context.Context, r *store.Instance, rep *gpuReport) error {
	if r.State == store.StateCreating || r.State == store.StateDestroying {
		return nil // an intent is in charge (or was just resolved)
	}
	g := m.hostGPU(r.GPUUUID)
	if g == nil || g.Lost {
		if r.State != store.StateLost {
			r.State, r.Reason, r.Updated = store.StateLost, "GPU is gone from the host (lost or removed)", m.now()
			if err := m.db.Update(func(tx *store.Tx) error { return tx.PutInstance(r) }); err != nil {
				// Reported lost all the same; the next pass, finding the
				// record not lost, writes it again.
				m.log.Error("record instance lost", "instance", r.UUID, "gpu", r.GPUPCI, "err", err)
			}
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
	rep.carved = true
	if err != nil {
		r.State, r.Reason, r.Updated = store.StateFailed, Message(classify(err, "re-create")), m.now()
		if uerr := m.db.Update(func(tx *store.Tx) error { return tx.PutInstance(r) }); uerr != nil {
			m.log.Error("record that an instance could not be re-created", "instance", r.UUID, "err", uerr)
		}
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
		start := r.GIStart
		if err := m.moveIfTaken(r, g); err != nil {
			return err
		}
		if err := m.recordMove(r, r.GIStart != start); err != nil {
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
		ciProfile, ciStart := ciArgs(r)
		c, err := m.mig.CreateComputeInstance(ctx, r.GPUUUID, r.GIID, ciProfile, ciStart)
		if err != nil {
			return err
		}
		r.CIID, r.CIProfileID = c.ID, c.ProfileID
	}
	if r.Kind == store.KindVGPU || r.Kind == store.KindMIGVGPU {
		_, _, vg := m.present(r)
		if !vg {
			vf, parent := r.VF, r.MdevParent
			if err := m.pickDevice(r, g); err != nil {
				return err
			}
			if err := m.recordMove(r, r.VF != vf || r.MdevParent != parent); err != nil {
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

// recordMove writes a record whose placement or device re-creation moved,
// before the driver call: a crash after the call then finds the device
// where the record says (present), one before it finds the new place free.
func (m *Manager) recordMove(r *store.Instance, moved bool) error {
	if !moved {
		return nil
	}
	r.Updated = m.now()
	return m.db.Update(func(tx *store.Tx) error { return tx.PutInstance(r) })
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
	md, ok := m.catalog().Model(r.Model)
	if !ok {
		return noModel(*r)
	}
	p, ok := md.GPUInstanceProfileByID(r.GIProfileID)
	if !ok {
		return fail(ErrBackendFailure, nil, "GPU model %s lost profile %d from the catalog", r.Model, r.GIProfileID)
	}
	d, err := placement.Place(m.migPool(s), placement.Request{Profile: p.Name, GPU: r.GPUUUID})
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
