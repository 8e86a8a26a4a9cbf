package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
	"github.com/vgpud/vgpud/pkg/virt"
)

// Virt is what the manager needs from libvirt (pkg/virt's Conn).
type Virt interface {
	URI() string
	Domain(ctx context.Context, ref string) (virt.Domain, error)
	Attach(ctx context.Context, domain string, h virt.Hostdev, instance string) (bool, error)
	Detach(ctx context.Context, domain string, h virt.Hostdev, instance string) error
	Attached(ctx context.Context, ref string) ([]virt.Attached, error)
	// Domains lists every domain (name, UUID, whether it runs).
	Domains(ctx context.Context) ([]virt.Domain, error)
	Events(ctx context.Context) <-chan virt.Event
	// Quiesce waits until calls that outran their deadline have returned.
	Quiesce(ctx context.Context) error
}

// AttachOptions modify Attach.
type AttachOptions struct {
	// Tenant, when set, must own the instance (orchestrators acting for a tenant).
	Tenant string
	// Display turns on the display of a display-capable (Q-series) mdev vGPU;
	// the domain needs a graphics device.
	Display bool
	// RamFB adds a boot framebuffer to the display (the console shows the
	// guest before its vGPU driver loads); it implies Display.
	RamFB bool
}

func classifyVirt(err error, format string, args ...any) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, virt.ErrDomainNotFound):
		return fail(ErrNotFound, err, format+": no such VM on this host (virsh list --all)", args...)
	case errors.Is(err, virt.ErrOtherHost):
		return fail(ErrInvalidArgument, err, format+": the VM is on another libvirt host; vgpud manages this host only", args...)
	case errors.Is(err, virt.ErrAttachedElsewhere):
		return fail(ErrConflict, err, format+": another VM already holds this device", args...)
	case errors.Is(err, virt.ErrUnreachable), errors.Is(err, virt.ErrClosed):
		return fail(ErrBackendFailure, err, format+": libvirtd is unreachable; start it (systemctl start libvirtd) and retry", args...)
	case errors.Is(err, virt.ErrLiveAttach):
		// libvirt's reason is what the operator acts on (no VFIO, a
		// missing device, a guest without hotplug), so the message says it
		// where it says what happened, not only in the daemon's log.
		reason := "libvirt gave no reason"
		var le *virt.LibvirtError
		if errors.As(err, &le) {
			reason = le.Error()
		}
		msg := fmt.Sprintf(format, args...) + ": the running VM refused the device (" + reason + "); its configuration is unchanged"
		return &opError{kind: ErrBackendFailure, msg: msg, cause: err, shown: true}
	case errors.Is(err, virt.ErrLiveDetach):
		return fail(ErrBusy, err, format+": the guest did not release the device; stop the VM or retry", args...)
	case errors.Is(err, virt.ErrNotPersistent), errors.Is(err, virt.ErrNeedsGraphics), errors.Is(err, virt.ErrInvalidHostdev):
		return fail(ErrInvalidArgument, err, format, args...)
	case errors.Is(err, virt.ErrTimeout):
		return fail(ErrBackendFailure, err, format+": libvirt did not answer in time; repeating the call is safe", args...)
	}
	return classify(err, format, args...)
}

// hostdevOf is the libvirt device an instance is attached as.
func (m *Manager) hostdevOf(r store.Instance, display, ramfb bool) (virt.Hostdev, error) {
	switch {
	case r.Kind == store.KindPassthrough:
		return virt.Hostdev{Kind: virt.Passthrough, PCI: r.GPUPCI}, nil
	case r.Kind == store.KindMIG:
		return virt.Hostdev{}, fail(ErrInvalidArgument, nil, "instance %s is a plain MIG instance (compute only) and cannot be attached to a VM; create a MIG-backed vGPU type instead (`vgpuctl profiles`)", r.UUID)
	case r.Flow == store.FlowVFIO:
		return virt.Hostdev{Kind: virt.VF, PCI: r.VF}, nil
	case r.Flow == store.FlowMdev:
		h := virt.Hostdev{Kind: virt.Mdev, MdevUUID: r.MdevUUID}
		if display {
			md, ok := m.catalog().Model(r.Model)
			if !ok {
				return h, noModel(r)
			}
			t, ok := md.VGPUTypeByID(r.TypeID)
			if !ok || t.Series == profile.SeriesC {
				return h, fail(ErrInvalidArgument, nil, "vGPU type %s has no display (C-series); attach without --display", r.TypeName)
			}
			h.Display, h.RamFB = true, ramfb
		}
		return h, nil
	}
	return virt.Hostdev{}, fail(ErrBackendFailure, nil, "instance %s has no device to attach", r.UUID)
}

// sameDevice reports whether two hostdevs name one device (an mdev by its
// UUID, a VF or GPU by its PCI address), whatever their display options.
func sameDevice(a, b virt.Hostdev) bool {
	if a.Kind != b.Kind {
		return false
	}
	if a.Kind == virt.Mdev {
		return a.MdevUUID == b.MdevUUID
	}
	return a.PCI == b.PCI
}

// Hostdev returns the libvirt device an instance is attached as.
func (m *Manager) Hostdev(id string) (virt.Hostdev, error) {
	rec, err := m.Instance(id)
	if err != nil {
		return virt.Hostdev{}, err
	}
	return m.hostdevOf(rec, false, false)
}

type attachPayload struct {
	Domain  string `json:"domain"`
	Display bool   `json:"display,omitempty"`
	RamFB   bool   `json:"ramfb,omitempty"`
}

// newAttachPayload records an attach's domain and display options (RamFB
// implies Display).
func newAttachPayload(domain string, opts AttachOptions) attachPayload {
	return attachPayload{Domain: domain, Display: opts.Display || opts.RamFB, RamFB: opts.RamFB}
}

// Attach makes an instance a hostdev of a VM: in its persistent config,
// and live when it runs. Repeating it for the same VM is a no-op; another
// VM is ErrConflict. A live attach the VM refuses leaves its config as it
// was (ErrBackendFailure).
func (m *Manager) Attach(ctx context.Context, id, domain string, opts AttachOptions) (store.Attachment, error) {
	if err := checkVMRef(domain); err != nil {
		return store.Attachment{}, err
	}
	if opts.Tenant != "" {
		// Only the name's form: a tenant that does not own the instance,
		// defined or not, is refused below as any other owner is.
		if err := tenant.ValidateName(opts.Tenant); err != nil {
			return store.Attachment{}, classify(err, "tenant")
		}
	}
	done, err := m.begin()
	if err != nil {
		return store.Attachment{}, err
	}
	defer done()
	if m.lv() == nil {
		return store.Attachment{}, fail(ErrBackendFailure, nil, "libvirt is not configured for this daemon")
	}
	rec, att, err := m.instanceAndAttachment(id)
	if err != nil {
		return store.Attachment{}, err
	}
	if opts.Tenant != "" && opts.Tenant != rec.Tenant {
		return store.Attachment{}, fail(ErrAccessDenied, nil, "instance %s belongs to another tenant", rec.UUID)
	}
	if rec.State != store.StateReady {
		return store.Attachment{}, fail(ErrBusy, nil, "instance %s is %s; only a ready instance can be attached", rec.UUID, rec.State)
	}
	dom, err := m.lv().Domain(ctx, domain)
	if err != nil {
		return store.Attachment{}, classifyVirt(err, "attach %s to VM %s", rec.UUID, domain)
	}
	if att != nil {
		if att.DomainUUID == dom.UUID {
			return *att, nil
		}
		return store.Attachment{}, fail(ErrConflict, nil, "instance %s is attached to VM %s; detach it first", rec.UUID, att.Domain)
	}
	p := newAttachPayload(dom.Name, opts)
	h, err := m.hostdevOf(rec, p.Display, p.RamFB)
	if err != nil {
		return store.Attachment{}, err
	}
	intent := uuid.NewString()
	defer m.inflight.add(intent, rec.UUID)()
	started := m.now()
	prior, err := m.writeAttachIntent(rec, p, intent)
	if err != nil {
		return store.Attachment{}, classify(err, "attach %s", rec.UUID)
	}
	if prior != nil {
		if prior.DomainUUID == dom.UUID {
			return *prior, nil
		}
		return store.Attachment{}, fail(ErrConflict, nil, "instance %s was attached to VM %s meanwhile; detach it first", rec.UUID, prior.Domain)
	}
	m.crash(CrashAttachIntent)
	live, err := m.lv().Attach(ctx, dom.Name, h, rec.UUID)
	if err != nil && !refused(err) {
		return m.attachUnclear(ctx, rec, p, dom.Name, intent, started, err)
	}
	if err != nil {
		if derr := m.dropIntent(intent); derr != nil {
			// libvirt refused: the domain is as it was, and reconcile
			// resolves the intent left behind against it.
			m.log.Error("drop the intent of a refused attach", "instance", rec.UUID, "vm", dom.Name, "err", derr)
		}
		cerr := classifyVirt(err, "attach %s to VM %s", rec.UUID, dom.Name)
		m.emit(Event{Kind: EventOperationFailed, ID: rec.UUID, Op: "attach", Detail: Message(cerr), Took: m.now().Sub(started)})
		return store.Attachment{}, cerr
	}
	m.crash(CrashAttachDone)
	a := store.Attachment{Instance: rec.UUID, Domain: dom.Name, DomainUUID: dom.UUID, URI: m.lv().URI(), Live: live, Created: m.now()}
	if err := m.db.Update(func(tx *store.Tx) error {
		if err := tx.PutAttachment(a); err != nil {
			return err
		}
		return tx.DeleteIntent(intent)
	}); err != nil {
		return store.Attachment{}, classify(err, "record attachment of %s", rec.UUID)
	}
	m.log.Info("attached", "instance", rec.UUID, "vm", dom.Name, "live", live)
	m.emit(Event{Kind: EventInstanceChanged, ID: rec.UUID})
	m.emit(Event{Kind: EventOperationDone, ID: rec.UUID, Op: "attach", Took: m.now().Sub(started)})
	return a, nil
}

// attachUnclear finishes an attach whose libvirt call (err) gave no clear
// answer (a timeout, a cancel, a broken connection): libvirt is asked what
// it holds now and that is recorded.
func (m *Manager) attachUnclear(ctx context.Context, rec store.Instance, p attachPayload, domain, intent string, started time.Time, err error) (store.Attachment, error) {
	a, held, serr := m.resolveUnclear(ctx, rec, p, intent, true)
	if serr == nil && held {
		m.log.Info("attached (resolved after an unclear answer)", "instance", rec.UUID, "vm", domain, "err", err)
		m.emit(Event{Kind: EventInstanceChanged, ID: rec.UUID})
		m.emit(Event{Kind: EventOperationDone, ID: rec.UUID, Op: "attach", Took: m.now().Sub(started)})
		return a, nil
	}
	cerr := classifyVirt(err, "attach %s to VM %s", rec.UUID, domain)
	if serr != nil {
		cerr = fail(ErrBackendFailure, err, "attach %s to VM %s: libvirt gave no clear answer and could not be asked again; vgpud resolves it when libvirtd answers", rec.UUID, domain)
	}
	m.emit(Event{Kind: EventOperationFailed, ID: rec.UUID, Op: "attach", Detail: Message(cerr), Took: m.now().Sub(started)})
	return store.Attachment{}, cerr
}

// writeAttachIntent writes an attach's intent, checking again in the same
// transaction that the instance is still there and ready and that no other
// operation holds it: a destroy or another attach that came in meanwhile
// is refused. An attachment made meanwhile is returned (prior) instead,
// with no intent written.
func (m *Manager) writeAttachIntent(rec store.Instance, p attachPayload, intent string) (prior *store.Attachment, err error) {
	payload, _ := json.Marshal(p) // strings and bools: cannot fail
	err = m.db.Update(func(tx *store.Tx) error {
		r, err := tx.Instance(rec.UUID)
		if err != nil {
			return fail(ErrNotFound, err, "instance %s was destroyed meanwhile", rec.UUID)
		}
		if r.State != store.StateReady {
			return fail(ErrBusy, nil, "instance %s is %s; only a ready instance can be attached", r.UUID, r.State)
		}
		if a, err := tx.Attachment(r.UUID); err == nil {
			prior = &a
			return nil
		}
		if err := busy(tx, r.UUID); err != nil {
			return err
		}
		return tx.PutIntent(store.Intent{ID: intent, Op: store.OpAttach, Instance: rec.UUID, Payload: payload, Started: m.now()})
	})
	return prior, err
}

// Detach removes an instance from its VM (live, waiting for the guest to
// release it, then the config). ErrNotFound when it is not attached.
func (m *Manager) Detach(ctx context.Context, id string) error {
	done, err := m.begin()
	if err != nil {
		return err
	}
	defer done()
	if m.lv() == nil {
		return fail(ErrBackendFailure, nil, "libvirt is not configured for this daemon")
	}
	rec, att, err := m.instanceAndAttachment(id)
	if err != nil {
		return err
	}
	if att == nil {
		return fail(ErrNotFound, nil, "instance %s is not attached to a VM", rec.UUID)
	}
	h, err := m.hostdevOf(rec, false, false)
	if err != nil {
		return err
	}
	intent := uuid.NewString()
	defer m.inflight.add(intent, rec.UUID)()
	started := m.now()
	payload, _ := json.Marshal(attachPayload{Domain: att.Domain}) // strings and bools: cannot fail
	if err := m.db.Update(func(tx *store.Tx) error {
		a, err := tx.Attachment(rec.UUID)
		if err != nil || a.Domain != att.Domain {
			return fail(ErrConflict, err, "the attachment of instance %s changed meanwhile; look again (`vgpuctl show %s`)", rec.UUID, rec.UUID)
		}
		if err := busy(tx, rec.UUID); err != nil {
			return err
		}
		return tx.PutIntent(store.Intent{ID: intent, Op: store.OpDetach, Instance: rec.UUID, Payload: payload, Started: m.now()})
	}); err != nil {
		return classify(err, "detach %s", rec.UUID)
	}
	m.crash(CrashDetachIntent)
	err = m.lv().Detach(ctx, att.Domain, h, rec.UUID)
	if errors.Is(err, virt.ErrDomainNotFound) {
		err = nil // the VM is gone: nothing holds the device
	}
	if err != nil && !refused(err) {
		// The outcome is unknown: finish the detach with a fresh deadline.
		if _, _, serr := m.resolveUnclear(ctx, rec, attachPayload{Domain: att.Domain}, intent, false); serr == nil {
			err = nil
		} else {
			cerr := fail(ErrBackendFailure, err, "detach %s from VM %s: libvirt gave no clear answer and could not be asked again; vgpud finishes the detach when libvirtd answers", rec.UUID, att.Domain)
			m.emit(Event{Kind: EventOperationFailed, ID: rec.UUID, Op: "detach", Detail: Message(cerr), Took: m.now().Sub(started)})
			return cerr
		}
		m.log.Info("detached (resolved after an unclear answer)", "instance", rec.UUID, "vm", att.Domain)
		m.emit(Event{Kind: EventInstanceChanged, ID: rec.UUID})
		m.emit(Event{Kind: EventOperationDone, ID: rec.UUID, Op: "detach", Took: m.now().Sub(started)})
		return nil
	}
	if err != nil {
		if derr := m.dropIntent(intent); derr != nil {
			// libvirt refused: the domain is as it was, and reconcile
			// resolves the intent left behind against it.
			m.log.Error("drop the intent of a refused detach", "instance", rec.UUID, "vm", att.Domain, "err", derr)
		}
		cerr := classifyVirt(err, "detach %s from VM %s", rec.UUID, att.Domain)
		m.emit(Event{Kind: EventOperationFailed, ID: rec.UUID, Op: "detach", Detail: Message(cerr), Took: m.now().Sub(started)})
		return cerr
	}
	m.crash(CrashDetachDone)
	if err := m.db.Update(func(tx *store.Tx) error {
		if err := tx.DeleteAttachment(rec.UUID); err != nil {
			return err
		}
		return tx.DeleteIntent(intent)
	}); err != nil {
		return classify(err, "forget attachment of %s", rec.UUID)
	}
	m.log.Info("detached", "instance", rec.UUID, "vm", att.Domain)
	m.emit(Event{Kind: EventInstanceChanged, ID: rec.UUID})
	m.emit(Event{Kind: EventOperationDone, ID: rec.UUID, Op: "detach", Took: m.now().Sub(started)})
	return nil
}

// refused reports whether libvirt refused a change outright, leaving the
// domain as it was; any other error (a timeout, a cancel, a broken
// connection) leaves the outcome unknown.
func refused(err error) bool {
	for _, e := range []error{virt.ErrInvalidHostdev, virt.ErrDomainNotFound, virt.ErrOtherHost, virt.ErrNotPersistent,
		virt.ErrAttachedElsewhere, virt.ErrNeedsGraphics, virt.ErrLiveAttach, virt.ErrLiveDetach} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// resolveTimeout bounds the look at libvirt after an unclear answer.
const resolveTimeout = 30 * time.Second

// resolveUnclear resolves an attach or detach whose libvirt call gave no
// clear answer, with its own deadline: libvirt is asked what it holds and
// the record follows (resolveAgainstDomain), and the intent is dropped.
// held says whether the device ended attached, with the attachment then
// recorded. When libvirt cannot be asked, the intent stays for reconcile.
func (m *Manager) resolveUnclear(ctx context.Context, rec store.Instance, p attachPayload, intent string, attach bool) (store.Attachment, bool, error) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveTimeout)
	defer cancel()
	if err := m.lv().Quiesce(sctx); err != nil {
		return store.Attachment{}, false, err
	}
	if err := m.resolveAgainstDomain(sctx, rec, p, attach); err != nil {
		m.log.Warn("resolve after an unclear libvirt answer; reconcile retries", "instance", rec.UUID, "vm", p.Domain, "err", err)
		return store.Attachment{}, false, err
	}
	var a store.Attachment
	held := false
	err := m.db.Update(func(tx *store.Tx) error {
		if x, err := tx.Attachment(rec.UUID); err == nil {
			a, held = x, true
		}
		return tx.DeleteIntent(intent)
	})
	return a, held, err
}

// busy refuses a second operation on an instance while another one's
// intent is in the store: attach, detach, destroy and move of one
// instance never interleave.
func busy(tx *store.Tx, instance string) error {
	its, err := tx.Intents()
	if err != nil {
		return err
	}
	for _, it := range its {
		if it.Instance == instance && it.Op != store.OpCreateAttach {
			return fail(ErrBusy, nil, "instance %s has a %s in flight; retry when it is done", instance, it.Op)
		}
	}
	return nil
}
