package manager

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// CreateRequest asks for one instance.
type CreateRequest struct {
	// UUID is the instance's identity. Set it to make retries idempotent: a
	// second Create with the same UUID and request returns the first result.
	UUID    string
	Tenant  string
	Profile string
	// GPU optionally pins the GPU (UUID, PCI address or index).
	GPU      string
	Affinity placement.Affinity
	// Wanted are demand hints for time-sliced vGPUs: how many more of each
	// type (by name) the caller will ask for after this request. An empty
	// GPU is then chosen so that they stay creatable (a homogeneous GPU
	// locks to its first type). Declarative apply sets it.
	Wanted map[string]int
}

// decision is where an admitted request goes.
type decision struct {
	o      offer
	g      *gpu.GPU
	start  int             // GPU-instance start (mig, mig-vgpu with a new GI)
	shared *store.Instance // mig-vgpu: an existing GI with room, owned by this record
	vf     string          // vendor-VFIO VF
	parent string          // mdev parent
	reason string
}

// undoTimeout bounds undo work when the caller's context is gone.
const undoTimeout = 2 * time.Minute

// Create admits and carves one instance. Admission (tenant quota and host
// capacity) is atomic with every other request: the decision is recorded,
// with an intent, before the admission lock is released. A failure at any
// step undoes the finished ones; the host is left as it was.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (store.Instance, error) {
	done, err := m.beginCarving()
	if err != nil {
		return store.Instance{}, err
	}
	defer done()
	if err := tenant.ValidateName(req.Tenant); err != nil {
		return store.Instance{}, classify(err, "tenant")
	}
	if req.UUID != "" {
		u, err := uuid.Parse(req.UUID)
		if err != nil {
			return store.Instance{}, fail(ErrInvalidArgument, err, "instance UUID %q is not a UUID", req.UUID)
		}
		req.UUID = u.String()
	} else {
		req.UUID = uuid.NewString()
	}
	offers, err := m.resolve(req.Profile)
	if err != nil {
		return store.Instance{}, err
	}
	started := m.now()
	intent := uuid.NewString()
	defer m.live.add(intent, req.UUID)()
	rec, existing, err := m.admitCreate(ctx, req, offers, intent)
	if err != nil || existing {
		return rec, err
	}
	m.crash(CrashCreateIntent)
	return m.carve(ctx, rec, intent, started)
}

func (m *Manager) admitCreate(ctx context.Context, req CreateRequest, offers []offer, intent string) (store.Instance, bool, error) {
	m.admit.Lock()
	defer m.admit.Unlock()
	var rec store.Instance
	existing := false
	err := m.db.Update(func(tx *store.Tx) error {
		if prev, err := tx.Instance(req.UUID); err == nil {
			if prev.Tenant != req.Tenant || prev.Profile != req.Profile {
				return fail(ErrConflict, nil, "instance %s exists with tenant %s and profile %s; use another UUID", prev.UUID, prev.Tenant, prev.Profile)
			}
			if prev.State == store.StateCreating {
				return fail(ErrBusy, nil, "instance %s is still being created; retry shortly", prev.UUID)
			}
			rec, existing = prev, true
			return nil
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		t, err := tx.Tenant(req.Tenant)
		if errors.Is(err, store.ErrNotFound) {
			return fail(ErrNotFound, err, "tenant %s does not exist; define it with `vgpuctl tenant define %s`", req.Tenant, req.Tenant)
		}
		if err != nil {
			return err
		}
		offers, err := allowed(t.Tenant, offers, req.Profile)
		if err != nil {
			return err
		}
		s, err := m.snapshot(tx)
		if err != nil {
			return err
		}
		d, err := m.decide(s, offers, req)
		if err != nil {
			return err
		}
		vram, compute, n := s.usage(req.Tenant)
		if err := t.Admit(tenant.Usage{VRAMBytes: vram, ComputeMilli: compute, Instances: n},
			tenant.Request{VRAMBytes: d.o.vram(), ComputeMilli: d.o.compute(), Model: d.o.model.Name, Profile: d.o.name()}); err != nil {
			return classify(err, "admit %s for tenant %s", req.Profile, req.Tenant)
		}
		rec = m.record(req, d)
		if err := tx.PutInstance(&rec); err != nil {
			return err
		}
		return tx.PutIntent(store.Intent{ID: intent, Op: store.OpCreate, Instance: rec.UUID, Started: m.now()})
	})
	if err != nil {
		return store.Instance{}, false, classify(err, "create %s for tenant %s", req.Profile, req.Tenant)
	}
	if !existing {
		m.log.Info("admitted", "instance", rec.UUID, "tenant", rec.Tenant, "profile", rec.Profile, "gpu", rec.GPUPCI, "kind", rec.Kind)
		// The record (state creating) holds its slot and quota from now:
		// readers see it at once.
		m.emit(Event{Kind: EventInstanceChanged, ID: rec.UUID})
	}
	return rec, existing, nil
}

// allowed keeps the offers a tenant may use.
func allowed(t tenant.Tenant, offers []offer, requested string) ([]offer, error) {
	var out []offer
	var lastErr error
	for _, o := range offers {
		err := t.Admit(tenant.Usage{}, tenant.Request{Model: o.model.Name, Profile: o.name()})
		if errors.Is(err, tenant.ErrNotAllowed) {
			// The profile may be allowed under the name it was asked by.
			if err2 := t.Admit(tenant.Usage{}, tenant.Request{Model: o.model.Name, Profile: requested}); !errors.Is(err2, tenant.ErrNotAllowed) {
				out = append(out, o)
				continue
			}
			lastErr = err
			continue
		}
		out = append(out, o)
	}
	if len(out) == 0 && lastErr != nil {
		return nil, classify(lastErr, "profile %s", requested)
	}
	return out, nil
}

func (m *Manager) record(req CreateRequest, d decision) store.Instance {
	r := store.Instance{
		UUID: req.UUID, Tenant: req.Tenant, Kind: d.o.kind, Profile: req.Profile, Model: d.o.model.Name,
		GPUUUID: d.g.UUID, GPUPCI: d.g.PCI,
		GIProfileID: -1, GIStart: -1, GIID: -1, CIProfileID: -1, CIID: -1,
		VRAMBytes: d.o.vram(), ComputeMilli: d.o.compute(), State: store.StateCreating,
		Reason: d.reason, Created: m.now(), Updated: m.now(),
	}
	if d.o.gi != nil {
		r.GIProfileID, r.GISize = d.o.gi.ID, d.o.gi.Size
		r.GIStart = d.start
		if d.shared != nil {
			r.GIStart, r.GIID = d.shared.GIStart, d.shared.GIID
		}
	}
	if d.o.typ != nil {
		r.TypeID, r.TypeName = d.o.typ.ID, d.o.typ.Name
		switch {
		case d.vf != "":
			r.Flow, r.VF = store.FlowVFIO, d.vf
		case d.parent != "":
			r.Flow, r.MdevParent, r.MdevUUID = store.FlowMdev, d.parent, req.UUID
		}
	}
	return r
}

// decide picks GPU, slot and device for a request.
func (m *Manager) decide(s *snapshot, offers []offer, req CreateRequest) (decision, error) {
	pin := ""
	if req.GPU != "" {
		g, err := m.gpuByAnyID(req.GPU)
		if err != nil {
			return decision{}, err
		}
		if why := s.unavailable(&g); why != "" {
			if g.Lost {
				return decision{}, fail(ErrGPULost, nil, "GPU %s is lost; choose another GPU", g.PCI)
			}
			return decision{}, fail(ErrNoCapacity, nil, "GPU %s takes no new instance: %s", g.PCI, why)
		}
		pin = g.UUID
	}
	models := map[string]offer{}
	var names []string
	for _, o := range offers {
		models[o.model.Name] = o
		names = append(names, o.model.Name)
	}
	sort.Strings(names)
	switch offers[0].kind {
	case store.KindMIG:
		return m.decideMIG(s, models, names, pin, req, false)
	case store.KindMIGVGPU:
		return m.decideMIG(s, models, names, pin, req, true)
	case store.KindVGPU:
		return m.decideVGPU(s, models, names, pin, req)
	}
	return m.decidePassthrough(s, models, pin)
}

func (m *Manager) gpuOf(s *snapshot, uuid string) *gpu.GPU {
	for i := range s.inv.GPUs {
		if s.inv.GPUs[i].UUID == uuid {
			return &s.inv.GPUs[i]
		}
	}
	return nil
}

// deviceFor picks the VF or mdev parent a vGPU of type typeID will use on g.
func (m *Manager) deviceFor(s *snapshot, g *gpu.GPU, typeID int) (vf, parent string, ok bool) {
	switch g.VGPU.Flavour {
	case gpu.FlavourVFIO:
		vf, ok = s.freeVF(g)
	case gpu.FlavourMdev:
		parent, ok = s.freeMdevParent(g, typeID)
	}
	return vf, parent, ok
}

func (m *Manager) decideMIG(s *snapshot, models map[string]offer, names []string, pin string, req CreateRequest, vgpu bool) (decision, error) {
	if pin != "" {
		if g := m.gpuOf(s, pin); g != nil && g.MIG.Capable && !g.MIG.Enabled {
			if _, ok := models[g.Model]; ok {
				return decision{}, fail(ErrInvalidArgument, nil, "MIG mode is off on GPU %s; enable it first (`vgpuctl gpu mig %s on`) or choose a GPU with MIG on", g.PCI, g.PCI)
			}
		}
	}
	fleet := m.migFleet(s)
	var any offer
	for _, o := range models {
		any = o
	}
	if vgpu {
		// A GPU instance of ours hosting this size with room takes it first
		// (types with several vGPUs per GPU instance).
		if any.typ.MaxPerGPUInstance > 1 {
			for i := range s.recs {
				r := &s.recs[i]
				if r.Kind != store.KindMIGVGPU || r.State != store.StateReady || models[r.Model].typ == nil || (pin != "" && r.GPUUUID != pin) {
					continue
				}
				t := models[r.Model].typ
				on := s.giRecords(r.GPUUUID, r.GIStart, r.GIProfileID)
				if r.GIProfileID != *t.GPUInstanceProfile || len(on) >= t.MaxPerGPUInstance {
					continue
				}
				sameSize := true
				for _, x := range on {
					if md, _ := m.catalog().Model(x.Model); md != nil {
						if xt, ok := md.VGPUTypeByID(x.TypeID); ok && xt.FramebufferMiB != t.FramebufferMiB {
							sameSize = false
						}
					}
				}
				g := m.gpuOf(s, r.GPUUUID)
				if !sameSize || g == nil || s.unavailable(g) != "" {
					continue
				}
				if vf, parent, ok := m.deviceFor(s, g, t.ID); ok {
					return decision{o: models[r.Model], g: g, shared: r, vf: vf, parent: parent,
						reason: fmt.Sprintf("shares GPU instance %d with %s", r.GIID, r.UUID)}, nil
				}
			}
		}
		// Only GPUs with a free VF or mdev parent can host the vGPU.
		for i := range fleet {
			g := m.gpuOf(s, fleet[i].ID)
			if _, _, ok := m.deviceFor(s, g, models[fleet[i].Model].typID()); !ok {
				fleet[i].Unavailable = true
			}
		}
	}
	pr := placement.Request{Profile: any.gi.Name, GPU: pin, Models: names, Tenant: req.Tenant, Affinity: req.Affinity}
	dec, err := placement.Place(fleet, pr)
	if err != nil {
		if errors.Is(err, placement.ErrUnknownProfile) && m.noMIGEnabled(s, names) {
			return decision{}, fail(ErrInvalidArgument, err, "no GPU of model %s has MIG enabled; enable it first (`vgpuctl gpu mig GPU on`)", strings.Join(names, ", "))
		}
		return decision{}, classify(err, "place %s", req.Profile)
	}
	g := m.gpuOf(s, dec.GPU)
	d := decision{o: models[g.Model], g: g, start: dec.Start, reason: dec.Reason}
	if vgpu {
		d.vf, d.parent, _ = m.deviceFor(s, g, d.o.typ.ID)
	}
	return d, nil
}

func (o offer) typID() int {
	if o.typ == nil {
		return 0
	}
	return o.typ.ID
}

func (m *Manager) noMIGEnabled(s *snapshot, models []string) bool {
	for _, g := range s.inv.GPUs {
		for _, name := range models {
			if g.Model == name && g.MIG.Enabled {
				return false
			}
		}
	}
	return true
}

func (m *Manager) decideVGPU(s *snapshot, models map[string]offer, names []string, pin string, req CreateRequest) (decision, error) {
	hosts := m.vgpuHosts(s)
	var any offer
	for _, o := range models {
		any = o
	}
	for i := range hosts {
		g := m.gpuOf(s, hosts[i].ID)
		if _, _, ok := m.deviceFor(s, g, models[hosts[i].Model].typID()); !ok {
			hosts[i].Unavailable = true
		}
	}
	dec, err := placement.PlaceVGPU(hosts, placement.VGPURequest{Type: any.typ.Name, GPU: pin, Models: names, Tenant: req.Tenant, Affinity: req.Affinity, Wanted: req.Wanted})
	if errors.Is(err, placement.ErrNoCapacity) {
		return decision{}, m.vgpuFull(s, models, pin, any.typ.Name, req.Profile, err)
	}
	if err != nil {
		return decision{}, classify(err, "place %s", req.Profile)
	}
	g := m.gpuOf(s, dec.GPU)
	d := decision{o: models[g.Model], g: g, reason: dec.Reason}
	d.vf, d.parent, _ = m.deviceFor(s, g, d.o.typ.ID)
	return d, nil
}

// vgpuFull words the refusal of a time-sliced vGPU that no GPU offering
// its type can take: how many GPUs offer it, why each is full, and what
// they could still take. Placement words it from the GPUs it was allowed
// to consider, and decideVGPU hides from it the GPUs without a free VF or
// mdev parent, so on a GPU whose VFs are all taken it would count none.
func (m *Manager) vgpuFull(s *snapshot, models map[string]offer, pin, typ, requested string, cause error) error {
	var full []string
	offering := 0
	free := map[string]int{}
	for _, h := range m.vgpuHosts(s) {
		o, ok := models[h.Model]
		if !ok || (pin != "" && h.ID != pin) {
			continue
		}
		if _, ok := h.Types[typ]; !ok {
			continue
		}
		offering++
		g := m.gpuOf(s, h.ID)
		md := o.model
		for name := range h.Types {
			if t, ok := md.VGPUTypeByName(name); ok {
				if n := min(placement.VGPURoom(h, name), s.freeDevices(g, t.ID)); n > 0 {
					free[name] += n
				}
			}
		}
		full = append(full, g.PCI+": "+m.vgpuFullWhy(s, g, h, o, typ))
	}
	var parts []string
	for _, name := range keys(free) {
		parts = append(parts, fmt.Sprintf("%s×%d", name, free[name]))
	}
	instead := "nothing"
	if len(parts) > 0 {
		instead = strings.Join(parts, ", ")
	}
	gpus := fmt.Sprintf("%d GPUs offer it and all are full", offering)
	switch {
	case pin != "":
		gpus = "the GPU asked for offers it and is full"
	case offering == 1:
		gpus = "1 GPU offers it and it is full"
	}
	msg := fmt.Sprintf("place %s: vGPU type %s: %s (%s); creatable there now: %s", requested, typ, gpus, strings.Join(full, "; "), instead)
	// The cause's own text counts the GPUs differently; msg replaces it.
	return &opError{kind: ErrNoCapacity, msg: msg, cause: cause, shown: true}
}

// vgpuFullWhy says why g takes no more vGPUs of type typ.
func (m *Manager) vgpuFullWhy(s *snapshot, g *gpu.GPU, h placement.VGPUHost, o offer, typ string) string {
	if why := s.unavailable(g); why != "" {
		return why
	}
	if g.MIG.Enabled {
		return "MIG is on (time-sliced vGPUs need it off)"
	}
	if s.freeDevices(g, o.typ.ID) == 0 {
		switch {
		case g.VGPU.Flavour == gpu.FlavourVFIO && len(g.VGPU.VFs) == 0:
			return "no SR-IOV VFs are enabled (run /usr/lib/nvidia/sriov-manage -e ALL)"
		case g.VGPU.Flavour == gpu.FlavourVFIO:
			return fmt.Sprintf("all %d of its VFs hold a vGPU", len(g.VGPU.VFs))
		}
		return "no free mdev parent for the type"
	}
	var held []string
	total := 0
	for _, name := range keys(h.Current) {
		if n := h.Current[name]; n > 0 {
			held = append(held, fmt.Sprintf("%s×%d", name, n))
			total += n
		}
	}
	c := h.Types[typ]
	switch {
	case !h.Heterogeneous && total > 0 && h.Current[typ] != total:
		return "holds " + strings.Join(held, ", ") + " (homogeneous mode: one type per GPU)"
	case !h.Heterogeneous:
		return fmt.Sprintf("holds %d of the %d %s it takes", h.Current[typ], c.Max, typ)
	}
	return "holds " + strings.Join(held, ", ") + fmt.Sprintf(" (heterogeneous mode: its %d MiB of framebuffer or the type's mixed-mode limit is used up)", h.MemoryMiB)
}

func (m *Manager) decidePassthrough(s *snapshot, models map[string]offer, pin string) (decision, error) {
	for i := range s.inv.GPUs {
		g := &s.inv.GPUs[i]
		o, ok := models[g.Model]
		if !ok || (pin != "" && g.UUID != pin) || s.unavailable(g) != "" {
			continue
		}
		if s.carved(g) {
			continue
		}
		return decision{o: o, g: g, reason: "whole GPU with nothing carved on it"}, nil
	}
	return decision{}, fail(ErrNoCapacity, nil, "no GPU of model %s is free of instances; destroy what lives on one to pass it through", strings.Join(keys(models), ", "))
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// carve performs the admitted record's steps on the host.
func (m *Manager) carve(ctx context.Context, rec store.Instance, intent string, started time.Time) (store.Instance, error) {
	l := m.gpuLock(rec.GPUUUID)
	l.Lock()
	defer l.Unlock()
	steps := map[string]bool{}
	save := func(step string) error {
		steps[step] = true
		rec.Updated = m.now()
		return m.db.Update(func(tx *store.Tx) error {
			if err := tx.PutInstance(&rec); err != nil {
				return err
			}
			return tx.AppendStep(intent, step)
		})
	}
	err := m.carveSteps(ctx, &rec, save)
	if err == nil {
		m.crash(CrashCreateCommit)
		rec.State, rec.Updated = store.StateReady, m.now()
		err = m.db.Update(func(tx *store.Tx) error {
			if err := tx.PutInstance(&rec); err != nil {
				return err
			}
			return tx.DeleteIntent(intent)
		})
	}
	defer m.refreshGPU(context.WithoutCancel(ctx), rec.GPUUUID)
	if err == nil {
		m.log.Info("created", "instance", rec.UUID, "tenant", rec.Tenant, "profile", rec.Profile, "gpu", rec.GPUPCI,
			"gi", rec.GIID, "vf", rec.VF, "mdev", rec.MdevUUID)
		m.emit(Event{Kind: EventInstanceAdded, ID: rec.UUID})
		m.emit(Event{Kind: EventOperationDone, ID: rec.UUID, Op: "create", Took: m.now().Sub(started)})
		return rec, nil
	}
	cerr := classify(err, "create %s on GPU %s", rec.Profile, rec.GPUPCI)
	m.log.Warn("create failed", "instance", rec.UUID, "profile", rec.Profile, "gpu", rec.GPUPCI, "err", err)
	m.emit(Event{Kind: EventOperationFailed, ID: rec.UUID, Op: "create", Detail: Message(cerr), Took: m.now().Sub(started)})
	if !timedOut(ctx, err) {
		m.undoCarve(rec, intent, steps, err)
		return store.Instance{}, cerr
	}
	// A driver or sysfs call outran the deadline and may still land: the
	// caller is answered now, and the undo waits for the host in the
	// background (the record, its quota and its slot stay until then).
	rec.Reason, rec.Updated = "create did not finish in time; vgpud takes it away once the driver answers", m.now()
	if err := m.db.Update(func(tx *store.Tx) error { return tx.PutInstance(&rec) }); err != nil {
		m.log.Error("record the pending undo", "instance", rec.UUID, "err", err)
	}
	letGo := m.live.add(intent, rec.UUID)
	m.background(func() {
		defer letGo()
		l := m.gpuLock(rec.GPUUUID)
		l.Lock()
		m.undoCarve(rec, intent, steps, err)
		l.Unlock()
		m.refreshGPU(context.Background(), rec.GPUUUID)
		m.emit(Event{Kind: EventInstanceRemoved, ID: rec.UUID})
	})
	return store.Instance{}, cerr
}

// timedOut: an operation failed because a host call outran its deadline
// or the caller gave up, so a call may still be running.
func timedOut(ctx context.Context, err error) bool {
	return errors.Is(err, gpu.ErrTimeout) || ctx.Err() != nil
}

// undoCarve takes away what a failed carve left on the host and drops its
// record and intent. If that fails the record is failed and the intent
// stays: reconcile finishes the undo. The caller holds the GPU's lock.
func (m *Manager) undoCarve(rec store.Instance, intent string, steps map[string]bool, cause error) {
	ctx, cancel := context.WithTimeout(context.Background(), undoTimeout)
	defer cancel()
	parts, uerr := m.carvedParts(ctx, &rec, steps)
	if uerr == nil {
		uerr = m.release(ctx, &rec, func(s string) bool { return parts[s] }, false)
	}
	if uerr != nil {
		rec.State, rec.Reason = store.StateFailed, fmt.Sprintf("create failed (%v) and undo failed (%v)", cause, uerr)
		_ = m.db.Update(func(tx *store.Tx) error { return tx.PutInstance(&rec) })
		m.log.Error("undo after failed create; reconcile finishes it", "instance", rec.UUID, "err", uerr)
		return
	}
	if err := m.db.Update(func(tx *store.Tx) error {
		if err := tx.DeleteInstance(rec.UUID); err != nil {
			return err
		}
		return tx.DeleteIntent(intent)
	}); err != nil {
		m.log.Error("drop record after undo", "instance", rec.UUID, "err", err)
	}
}

// carvedParts says which parts of a failed carve the host holds: the steps
// recorded as done, and whatever the host shows once the calls that outran
// their deadline have returned (a step whose call timed out, or whose save
// failed, may have happened all the same).
func (m *Manager) carvedParts(ctx context.Context, rec *store.Instance, steps map[string]bool) (map[string]bool, error) {
	if err := m.settle(ctx); err != nil {
		return nil, err
	}
	m.refreshGPU(ctx, rec.GPUUUID)
	gi, ci, vg := m.present(rec)
	return map[string]bool{"gi": steps["gi"] || gi, "ci": steps["ci"] || ci, "vgpu": steps["vgpu"] || vg}, nil
}

// carveSteps runs the host steps of a record, saving after each.
func (m *Manager) carveSteps(ctx context.Context, rec *store.Instance, save func(string) error) error {
	if rec.Kind == store.KindMIG || (rec.Kind == store.KindMIGVGPU && rec.GIID < 0) {
		gi, err := m.mig.CreateGPUInstance(ctx, rec.GPUUUID, rec.GIProfileID, rec.GIStart)
		if err != nil {
			return err
		}
		rec.GIID = gi.ID
		if err := save("gi"); err != nil {
			return err
		}
		m.crash(CrashCreateGI)
	}
	if rec.Kind == store.KindMIG {
		ci, err := m.mig.CreateComputeInstance(ctx, rec.GPUUUID, rec.GIID, -1)
		if err != nil {
			return err
		}
		rec.CIID, rec.CIProfileID = ci.ID, ci.ProfileID
		if err := save("ci"); err != nil {
			return err
		}
		m.crash(CrashCreateCI)
	}
	if rec.Kind == store.KindVGPU || rec.Kind == store.KindMIGVGPU {
		if err := m.createVGPU(ctx, rec); err != nil {
			return err
		}
		if err := save("vgpu"); err != nil {
			return err
		}
		m.crash(CrashCreateVGPU)
		if rec.Kind == store.KindMIGVGPU {
			if err := m.checkGI(ctx, rec); err != nil {
				return err
			}
		}
	}
	return nil
}

func (m *Manager) createVGPU(ctx context.Context, rec *store.Instance) error {
	vf, typeID, parent, mdev := rec.VF, rec.TypeID, rec.MdevParent, rec.MdevUUID
	switch rec.Flow {
	case store.FlowVFIO:
		return m.sysfsCall(ctx, func() error { return m.vgpu.SetVFType(vf, typeID) })
	case store.FlowMdev:
		return m.sysfsCall(ctx, func() error { return m.vgpu.CreateMdev(parent, typeID, mdev) })
	}
	return fail(ErrBackendFailure, nil, "instance %s has no VF or mdev parent", rec.UUID)
}

// checkGI verifies the driver put a MIG-backed vGPU on the GPU instance
// vgpud chose (the driver picks the GI itself, reference 2.7).
func (m *Manager) checkGI(ctx context.Context, rec *store.Instance) error {
	flow, vfAddr, mdev := rec.Flow, rec.VF, rec.MdevUUID
	got, err := sysfsRead(ctx, m, func() (int, error) {
		switch flow {
		case store.FlowVFIO:
			vf, err := m.vgpu.VF(vfAddr)
			return vf.GPUInstance, err
		case store.FlowMdev:
			md, err := m.vgpu.Mdev(mdev)
			return md.GPUInstance, err
		}
		return -1, nil
	})
	if err != nil {
		return err
	}
	if got >= 0 && got != rec.GIID {
		return fail(ErrConflict, nil, "the driver put the vGPU on GPU instance %d, not on %d that vgpud made for it; destroy the unused GPU instances vgpud did not create and retry", got, rec.GIID)
	}
	return nil
}
