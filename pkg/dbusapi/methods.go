package dbusapi

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/tenant"
	"github.com/vgpud/vgpud/pkg/virt"
)

// The Manager's methods. Each only translates: arguments to a manager
// call, its result to D-Bus types, its error to a named error. Mutations
// re-read the objects before they reply, so the caller's subscribers have
// InterfacesAdded and PropertiesChanged before the reply.

func (s *Service) listGPUs(c *call) ([]gpuEntry, error) {
	gpus, err := s.m.GPUs()
	if err != nil {
		return nil, err
	}
	out := []gpuEntry{}
	for _, g := range gpus {
		out = append(out, gpuEntry{PCI: g.PCI, UUID: g.UUID, Model: g.Model, State: string(g.State), Instances: uint32(len(g.Instances)), Object: GPUPath(g.PCI)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PCI < out[j].PCI })
	return out, nil
}

func (s *Service) listInstances(c *call, tenantName string) ([]instanceEntry, error) {
	// The one place an empty tenant means every tenant: a read, and
	// documented so. Mutations never take "all" from an empty name.
	list := s.m.AllInstances
	if tenantName != "" {
		list = func() ([]manager.InstanceView, error) { return s.m.TenantInstances(tenantName) }
	}
	insts, err := list()
	if err != nil {
		return nil, err
	}
	out := []instanceEntry{}
	for _, v := range insts {
		e := instanceEntry{UUID: v.UUID, Tenant: v.Tenant, Profile: v.Profile, Kind: string(v.Kind), GPU: v.GPUPCI, State: string(v.State), Object: InstancePath(v.UUID)}
		if v.Attachment != nil {
			e.VM = v.Attachment.Domain
		}
		out = append(out, e)
	}
	return out, nil
}

func (s *Service) listTenants(c *call) ([]tenantEntry, error) {
	ts, err := s.m.Tenants()
	if err != nil {
		return nil, err
	}
	out := []tenantEntry{}
	for _, t := range ts {
		out = append(out, tenantEntry{Name: t.Name, Class: string(t.Class), Instances: uint32(t.Usage.Instances), Object: TenantPath(t.Name)})
	}
	return out, nil
}

func (s *Service) listProfiles(c *call, gpuID string) ([]profileEntry, error) {
	model := ""
	if gpuID != "" {
		g, err := s.m.GPU(gpuID)
		if err != nil {
			return nil, err
		}
		model = g.Model
	}
	out := []profileEntry{}
	for _, p := range s.m.Profiles() {
		if model != "" && p.Model != model {
			continue
		}
		out = append(out, profileEntry{Model: p.Model, Name: p.Name, Kind: p.Kind, VRAMBytes: p.VRAMBytes, Compute: p.ComputeMilli, MaxPerGPU: int32(p.MaxPerGPU), Flows: p.Flows})
	}
	return out, nil
}

func capacityEntries(cs []manager.Capacity) []capacityEntry {
	out := []capacityEntry{}
	for _, x := range cs {
		out = append(out, capacityEntry{Model: x.Model, Profile: x.Profile, Kind: x.Kind, Count: uint32(max(0, x.Count)), GPUs: uint32(max(0, x.GPUs))})
	}
	return out
}

func (s *Service) getCapacity(c *call) ([]capacityEntry, error) {
	cs, err := s.m.Capacity()
	if err != nil {
		return nil, err
	}
	return capacityEntries(cs), nil
}

func moveEntries(ms []placement.Move, pciOf func(string) string) []moveEntry {
	out := []moveEntry{}
	for _, m := range ms {
		out = append(out, moveEntry{Instance: m.Instance, Profile: m.Profile, FromGPU: pciOf(m.FromGPU), FromStart: int32(m.FromStart), ToGPU: pciOf(m.ToGPU), ToStart: int32(m.ToStart)})
	}
	return out
}

// pciOf maps a GPU UUID to its PCI address (placement speaks UUIDs; the
// API speaks PCI addresses).
func (s *Service) pciOf(uuid string) string {
	for _, g := range s.m.Inventory().GPUs {
		if g.UUID == uuid {
			return g.PCI
		}
	}
	return uuid
}

func (s *Service) plan(c *call, tenantName, profile string, options map[string]dbus.Variant) (
	fits bool, model, gpuPCI, gpuUUID string, start int32, device string, vram, compute uint64, reason, refusal string,
	quotaOK bool, quotaMsg string, moves []moveEntry, freeAfter []capacityEntry, err error) {
	o := newOpts(c.member, options)
	pin := o.str("gpu")
	// A read, but with the options every long operation takes (timeout,
	// operation id), checked the same way.
	ctx, end, err := c.begin(o)
	if err != nil {
		return
	}
	defer end()
	p, err := s.m.Plan(ctx, manager.CreateRequest{Tenant: tenantName, Profile: profile, GPU: pin})
	if err != nil {
		return
	}
	device = p.VF
	if device == "" {
		device = p.MdevParent
	}
	return p.Fits, p.Model, p.GPUPCI, p.GPU, int32(p.Start), device, p.VRAMBytes, p.ComputeMilli, p.Reason, p.Refusal,
		p.QuotaOK, p.QuotaMessage, moveEntries(p.Moves, s.pciOf), capacityEntries(p.FreeAfter), nil
}

func affinityOf(member, s string) (placement.Affinity, error) {
	switch s {
	case "", "none":
		return placement.AffinityNone, nil
	case "spread":
		return placement.AffinitySpread, nil
	case "pack":
		return placement.AffinityPack, nil
	}
	return 0, invalidArg("%s: option affinity %q: want none, spread or pack", member, s)
}

func (s *Service) createRequest(c *call, o *opts, tenantName, profile string) (manager.CreateRequest, error) {
	req := manager.CreateRequest{Tenant: tenantName, Profile: profile, GPU: o.str("gpu"), UUID: o.str("uuid"),
		PlacementConsumer: o.str(OptPlacementConsumer)}
	aff, err := affinityOf(c.member, o.str("affinity"))
	req.Affinity = aff
	return req, err
}

func (s *Service) createInstance(c *call, tenantName, profile string, options map[string]dbus.Variant) (dbus.ObjectPath, string, error) {
	o := newOpts(c.member, options)
	req, err := s.createRequest(c, o, tenantName, profile)
	if err != nil {
		return "", "", err
	}
	ctx, end, err := c.begin(o)
	if err != nil {
		return "", "", err
	}
	defer end()
	ctx, outcome := manager.WithPlacementOutcome(ctx)
	rec, err := s.m.Create(ctx, req)
	s.sync()
	if err != nil {
		return "", "", cancelled(ctx, err)
	}
	s.placementBehind(c, "create", rec.UUID, outcome)
	return InstancePath(rec.UUID), rec.UUID, nil
}

// placementBehind tells the caller, before the reply goes (signals and
// replies from one connection arrive in order), that the operation left
// Placement to the sync. The signal is unicast to the caller: it reaches
// a caller polkit authorized outside group vgpud (the bus policy lets
// everyone receive this one signal, and only as its destination), and
// nobody else.
func (s *Service) placementBehind(c *call, op, id string, o *manager.PlacementOutcome) {
	detail := o.Behind()
	if detail == "" || c.sender == "" {
		return
	}
	msg := &dbus.Message{Type: dbus.TypeSignal, Headers: map[dbus.HeaderField]dbus.Variant{
		dbus.FieldPath:        dbus.MakeVariant(ManagerPath),
		dbus.FieldInterface:   dbus.MakeVariant(ManagerInterface),
		dbus.FieldMember:      dbus.MakeVariant("PlacementBehind"),
		dbus.FieldDestination: dbus.MakeVariant(c.sender),
		dbus.FieldSignature:   dbus.MakeVariant(dbus.SignatureOf(op, id, detail)),
	}, Body: []any{op, id, detail}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if call := <-s.conn.SendWithContext(ctx, msg, make(chan *dbus.Call, 1)).Done; call.Err != nil {
		s.log.Warn("send PlacementBehind", "to", c.sender, "instance", id, "err", call.Err)
	}
}

// cancelled says, when the caller's timeout or Cancel ended an operation,
// that this is why it failed. An error the context itself caused (a driver
// call cut off at the caller's deadline) is named Timeout, as the client
// names the same deadline when its own timer fires first: which of the two
// the caller sees is a race, and it must not change the name. Any other
// error (a refusal that came before the deadline) keeps the manager's name.
func cancelled(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		return err
	}
	why := "cancelled"
	if ctx.Err() == context.DeadlineExceeded {
		why = "stopped at the caller's timeout"
	}
	de := toDBusError(err)
	msg, _ := de.Body[0].(string)
	if errors.Is(context.Cause(ctx), errStopping) {
		// Not the caller's doing nor the host's: say so, and name it as
		// the manager names a refusal while it shuts down.
		return &dbus.Error{Name: ErrorPrefix + NameBusy, Body: []any{fmt.Sprintf("%s (the operation was cancelled because vgpud is stopping; what it did is undone: retry when vgpud is back)", msg)}}
	}
	name := de.Name
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		name = ErrorPrefix + NameTimeout
	}
	return &dbus.Error{Name: name, Body: []any{fmt.Sprintf("%s (the operation was %s; what it did is undone)", msg, why)}}
}

// applyCancelled words an apply that the caller's timeout, Cancel or
// vgpud's stop ended: unlike the other operations, what it did stays.
func applyCancelled(ctx context.Context, err error) error {
	de := toDBusError(err)
	msg, _ := de.Body[0].(string)
	name, why := de.Name, "cancelled"
	switch {
	case errors.Is(context.Cause(ctx), errStopping):
		name, why = ErrorPrefix+NameBusy, "cancelled because vgpud is stopping"
	case ctx.Err() == context.DeadlineExceeded:
		why = "stopped at the caller's timeout"
	}
	// Execute stops between changes, and each change is a manager
	// operation that finishes or undoes itself on its own.
	return &dbus.Error{Name: name, Body: []any{fmt.Sprintf("%s (the apply was %s: it began no further change, a change under way finished or was undone on its own, "+
		"and the changes already done stay: an apply is not undone as a whole)", msg, why)}}
}

func (s *Service) destroy(c *call, id string, options map[string]dbus.Variant) error {
	o := newOpts(c.member, options)
	detach := o.boolean("detach")
	ctx, end, err := c.begin(o)
	if err != nil {
		return err
	}
	defer end()
	ctx, outcome := manager.WithPlacementOutcome(ctx)
	err = s.m.Destroy(ctx, id, manager.DestroyOptions{Detach: detach})
	s.sync()
	if err == nil {
		s.placementBehind(c, "destroy", id, outcome)
	}
	return cancelled(ctx, err)
}

func (s *Service) destroyInstance(c *call, id string, options map[string]dbus.Variant) error {
	return s.destroy(c, id, options)
}

func (s *Service) attachTo(c *call, id, vm string, options map[string]dbus.Variant) (string, bool, error) {
	o := newOpts(c.member, options)
	ao := manager.AttachOptions{Display: o.boolean("display"), RamFB: o.boolean("ramfb"), Tenant: o.str("tenant")}
	ctx, end, err := c.begin(o)
	if err != nil {
		return "", false, err
	}
	defer end()
	a, err := s.m.Attach(ctx, id, vm, ao)
	s.sync()
	if err != nil {
		return "", false, cancelled(ctx, err)
	}
	return a.DomainUUID, a.Live, nil
}

func (s *Service) attach(c *call, id, vm string, options map[string]dbus.Variant) (string, bool, error) {
	return s.attachTo(c, id, vm, options)
}

func (s *Service) createAndAttach(c *call, tenantName, profile, vm string, options map[string]dbus.Variant) (dbus.ObjectPath, string, bool, error) {
	o := newOpts(c.member, options)
	req, err := s.createRequest(c, o, tenantName, profile)
	if err != nil {
		return "", "", false, err
	}
	ao := manager.AttachOptions{Display: o.boolean("display"), RamFB: o.boolean("ramfb")}
	ctx, end, err := c.begin(o)
	if err != nil {
		return "", "", false, err
	}
	defer end()
	ctx, outcome := manager.WithPlacementOutcome(ctx)
	rec, a, err := s.m.CreateAndAttach(ctx, req, vm, ao)
	s.sync()
	if err != nil {
		return "", "", false, cancelled(ctx, err)
	}
	s.placementBehind(c, "create", rec.UUID, outcome)
	return InstancePath(rec.UUID), rec.UUID, a.Live, nil
}

func (s *Service) detachFrom(c *call, id string, options map[string]dbus.Variant) error {
	o := newOpts(c.member, options)
	ctx, end, err := c.begin(o)
	if err != nil {
		return err
	}
	defer end()
	err = s.m.Detach(ctx, id)
	s.sync()
	return cancelled(ctx, err)
}

func (s *Service) detach(c *call, id string, options map[string]dbus.Variant) error {
	return s.detachFrom(c, id, options)
}

func (s *Service) hostdevXML(c *call, id string) (string, error) {
	h, err := s.m.Hostdev(id)
	if err != nil {
		return "", err
	}
	doc, err := virt.HostdevXML(h)
	if err != nil {
		return "", &apiError{kind: manager.ErrBackendFailure, cause: err,
			msg: fmt.Sprintf("vgpud could not write the hostdev XML of instance %s; its log has the cause", id)}
	}
	return doc, nil
}

func (s *Service) defineTenant(c *call, name string, vram, compute, maxInst uint64, class string, options map[string]dbus.Variant) (dbus.ObjectPath, error) {
	o := newOpts(c.member, options)
	t := tenant.Tenant{Name: name, Quota: o.quota(vram, compute, maxInst),
		Class: tenant.Class(class), AllowedModels: o.strings("allowed-models"), AllowedProfiles: o.strings("allowed-profiles")}
	ctx, end, err := c.begin(o)
	if err != nil {
		return "", err
	}
	defer end()
	out, err := s.m.DefineTenant(ctx, t)
	s.sync()
	if err != nil {
		return "", err
	}
	return TenantPath(out.Name), nil
}

func (s *Service) setQuota(c *call, name string, vram, compute, maxInst uint64, options map[string]dbus.Variant) error {
	o := newOpts(c.member, options)
	q := o.quota(vram, compute, maxInst)
	ctx, end, err := c.begin(o)
	if err != nil {
		return err
	}
	defer end()
	_, err = s.m.SetQuota(ctx, name, q)
	s.sync()
	return cancelled(ctx, err)
}

func (s *Service) undefineTenant(c *call, name string, force bool, options map[string]dbus.Variant) error {
	o := newOpts(c.member, options)
	ctx, end, err := c.begin(o)
	if err != nil {
		return err
	}
	defer end()
	err = s.m.UndefineTenant(ctx, name, force)
	s.sync()
	return cancelled(ctx, err)
}

func (s *Service) apply(c *call, data, sel string, dryRun bool, options map[string]dbus.Variant) (string, string, string, error) {
	o := newOpts(c.member, options)
	name := o.str("name")
	ctx, end, err := c.begin(o)
	if err != nil {
		return "", "", "", err
	}
	defer end()
	if s.opts.Apply == nil {
		return "", "", "", apiErr(manager.ErrBackendFailure, "apply not available: this vgpud was built without declarative configuration support; create instances with CreateInstance")
	}
	out, err := s.opts.Apply.Apply(ctx, ApplyRequest{Name: name, Data: []byte(data), Select: sel, DryRun: dryRun})
	if !dryRun {
		s.sync()
	}
	if err != nil && ctx.Err() != nil && !dryRun {
		return "", "", "", applyCancelled(ctx, err)
	}
	if err != nil {
		return "", "", "", cancelled(ctx, err)
	}
	changes, result := string(out.Changes), string(out.Result)
	if changes == "" {
		changes = "null"
	}
	if result == "" {
		result = "null"
	}
	return changes, result, out.Summary, nil
}

func (s *Service) reconcile(c *call, options map[string]dbus.Variant) (uint64, []string, []string, []string, []string, []string, []foreignEntry, []string, []string, error) {
	o := newOpts(c.member, options)
	ctx, end, err := c.begin(o)
	if err != nil {
		return 0, nil, nil, nil, nil, nil, nil, nil, nil, err
	}
	defer end()
	rep, err := s.m.Reconcile(ctx)
	s.sync()
	if err != nil {
		return 0, nil, nil, nil, nil, nil, nil, nil, nil, cancelled(ctx, err)
	}
	foreign := []foreignEntry{}
	for _, f := range rep.Foreign {
		foreign = append(foreign, foreignEntry{GPU: s.pciOf(f.GPU), Kind: string(f.Kind), ID: f.ID, Detail: f.Detail})
	}
	return uint64(rep.Duration.Microseconds()), nonNilStrings(rep.Finished), nonNilStrings(rep.Undone), nonNilStrings(rep.Recreated),
		nonNilStrings(rep.Lost), nonNilStrings(rep.Failed), foreign, nonNilStrings(rep.Attachments), nonNilStrings(rep.Pending), nil
}

func (s *Service) defragment(c *call, tenantName, profile string, apply bool, options map[string]dbus.Variant) ([]moveEntry, string, int32, bool, error) {
	o := newOpts(c.member, options)
	req := manager.CreateRequest{Tenant: tenantName, Profile: profile, GPU: o.str("gpu")}
	ctx, end, err := c.begin(o)
	if err != nil {
		return nil, "", 0, false, err
	}
	defer end()
	res, err := s.m.Defragment(ctx, req, apply)
	if apply {
		s.sync()
	}
	if err != nil {
		return nil, "", 0, false, cancelled(ctx, err)
	}
	return moveEntries(res.Moves, s.pciOf), s.pciOf(res.GPU), int32(res.Start), res.Applied, nil
}

func (s *Service) gpuSwitch(c *call, id string, on bool, options map[string]dbus.Variant, fn func(context.Context, string, bool) error) error {
	o := newOpts(c.member, options)
	ctx, end, err := c.begin(o)
	if err != nil {
		return err
	}
	defer end()
	err = fn(ctx, id, on)
	s.sync()
	return cancelled(ctx, err)
}

func (s *Service) setMIGMode(c *call, id string, on bool, options map[string]dbus.Variant) error {
	return s.gpuSwitch(c, id, on, options, s.m.SetMIGMode)
}

func (s *Service) setHeterogeneous(c *call, id string, on bool, options map[string]dbus.Variant) error {
	return s.gpuSwitch(c, id, on, options, s.m.SetHeterogeneous)
}

func (s *Service) setGPUScheduler(c *call, id, mode, policy string, timesliceUsec uint64, options map[string]dbus.Variant) (string, bool, string, error) {
	o := newOpts(c.member, options)
	ctx, end, err := c.begin(o)
	if err != nil {
		return "", false, "", err
	}
	defer end()
	if timesliceUsec > uint64(time.Hour/time.Microsecond) {
		return "", false, "", invalidArg("SetGPUScheduler: time slice %d µs is out of range", timesliceUsec)
	}
	v, err := s.m.SetGPUScheduler(ctx, id, manager.SchedulerRequest{Mode: mode, Policy: policy, Timeslice: time.Duration(timesliceUsec) * time.Microsecond})
	s.sync()
	if err != nil {
		return "", false, "", cancelled(ctx, err)
	}
	return v.Mode, v.Pending, v.PendingWhy, nil
}

func (s *Service) setGPUInstanceScheduler(c *call, id string, gi int32, mode, policy string, timesliceUsec uint64, options map[string]dbus.Variant) (string, bool, string, error) {
	o := newOpts(c.member, options)
	ctx, end, err := c.begin(o)
	if err != nil {
		return "", false, "", err
	}
	defer end()
	if timesliceUsec > uint64(time.Hour/time.Microsecond) {
		return "", false, "", invalidArg("SetGPUInstanceScheduler: time slice %d µs is out of range", timesliceUsec)
	}
	v, err := s.m.SetGPUInstanceScheduler(ctx, id, int(gi), manager.SchedulerRequest{Mode: mode, Policy: policy, Timeslice: time.Duration(timesliceUsec) * time.Microsecond})
	s.sync()
	if err != nil {
		return "", false, "", cancelled(ctx, err)
	}
	return v.Mode, v.Pending, v.PendingWhy, nil
}

func (s *Service) objSetScheduler(c *call, mode, policy string, timesliceUsec uint64, options map[string]dbus.Variant) (string, bool, string, error) {
	return s.setGPUScheduler(c, c.id, mode, policy, timesliceUsec, options)
}

func (s *Service) clearGPU(c *call, id string, options map[string]dbus.Variant) error {
	o := newOpts(c.member, options)
	ctx, end, err := c.begin(o)
	if err != nil {
		return err
	}
	defer end()
	_, err = s.m.ClearGPU(ctx, id)
	s.sync()
	return cancelled(ctx, err)
}

func (s *Service) objClear(c *call, options map[string]dbus.Variant) error {
	return s.clearGPU(c, c.id, options)
}

func (s *Service) getShares(c *call) ([]shareEntry, error) {
	insts, err := s.m.AllInstances()
	if err != nil {
		return nil, err
	}
	var fromEngine map[string]Share
	if s.opts.Shares != nil {
		list, err := s.opts.Shares.Shares(c.ctx)
		if err != nil {
			// The entitled column still means something without the engine.
			s.log.Warn("share engine", "err", err)
		} else {
			fromEngine = map[string]Share{}
			for _, sh := range list {
				fromEngine[sh.Instance] = sh
			}
		}
	}
	tenants, err := s.m.Tenants()
	if err != nil {
		return nil, err
	}
	guaranteed := map[string]bool{}
	for _, t := range tenants {
		guaranteed[t.Name] = t.Class == tenant.Guaranteed
	}
	out := []shareEntry{}
	for _, v := range insts {
		// Entitled as the share engine and the metrics define it: the
		// instance's compute for a guaranteed tenant, 0 for a best-effort
		// one, with or without the engine.
		e := shareEntry{Instance: v.UUID, Achieved: -1, Demand: -1, Interference: -1}
		if guaranteed[v.Tenant] {
			e.Entitled = v.ComputeMilli
		}
		if sh, ok := fromEngine[v.UUID]; ok {
			e.Achieved, e.Demand, e.Interference = sh.AchievedMilli, sh.DemandMilli, sh.Interference
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Instance < out[j].Instance })
	return out, nil
}

func (s *Service) cancelOp(c *call, id string) error {
	if strings.TrimSpace(id) == "" {
		return invalidArg("Cancel: empty operation id")
	}
	// The uid authorization found, never a cache look-up: a miss there
	// would read as uid 0 and let anyone cancel anything.
	member, err := s.ops.cancelID(id, c.caller.UID)
	if err != nil {
		if errors.Is(err, manager.ErrAccessDenied) {
			s.log.Warn("access denied", "uid", c.caller.UID, "method", c.member, "path", string(c.path), "sender", c.sender, "needs", "owner of operation "+id)
		}
		return err
	}
	s.log.Info("operation cancelled by request", "operation", id, "method", member, "uid", c.caller.UID)
	return nil
}

// Per-object methods: the id comes from the object path.

func (s *Service) objSetMIGMode(c *call, on bool, options map[string]dbus.Variant) error {
	return s.setMIGMode(c, c.id, on, options)
}

func (s *Service) objSetHeterogeneous(c *call, on bool, options map[string]dbus.Variant) error {
	return s.setHeterogeneous(c, c.id, on, options)
}

func (s *Service) objDestroy(c *call, options map[string]dbus.Variant) error {
	return s.destroy(c, c.id, options)
}

func (s *Service) objAttach(c *call, vm string, options map[string]dbus.Variant) (string, bool, error) {
	return s.attachTo(c, c.id, vm, options)
}

func (s *Service) objDetach(c *call, options map[string]dbus.Variant) error {
	return s.detachFrom(c, c.id, options)
}

func (s *Service) objHostdevXML(c *call) (string, error) { return s.hostdevXML(c, c.id) }

func (s *Service) objSetQuota(c *call, vram, compute, maxInst uint64, options map[string]dbus.Variant) error {
	return s.setQuota(c, c.id, vram, compute, maxInst, options)
}

func (s *Service) objUndefine(c *call, force bool, options map[string]dbus.Variant) error {
	return s.undefineTenant(c, c.id, force, options)
}
