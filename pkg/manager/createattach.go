package manager

import (
	"context"
	"encoding/json"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/store"
)

// CreateAndAttach creates an instance and attaches it; if the attach fails
// the instance is destroyed again and the VM is left as it was. A crash
// half-way is undone by reconcile the same way (an OpCreateAttach intent
// spans both). A retry with the UUID of an instance that already exists
// attaches it and never destroys it: that instance is not this call's.
func (m *Manager) CreateAndAttach(ctx context.Context, req CreateRequest, domain string, opts AttachOptions) (store.Instance, store.Attachment, error) {
	// Every argument is checked before libvirt is asked.
	if err := checkVMRef(domain); err != nil {
		return store.Instance{}, store.Attachment{}, err
	}
	if err := m.knownTenant(req.Tenant); err != nil {
		return store.Instance{}, store.Attachment{}, err
	}
	if _, err := m.offersFor(req.Profile); err != nil {
		return store.Instance{}, store.Attachment{}, err
	}
	if req.UUID != "" {
		u, err := instanceUUID(req.UUID)
		if err != nil {
			return store.Instance{}, store.Attachment{}, err
		}
		req.UUID = u
	}
	done, err := m.begin()
	if err != nil {
		return store.Instance{}, store.Attachment{}, err
	}
	defer done()
	if m.lv() == nil {
		return store.Instance{}, store.Attachment{}, fail(ErrBackendFailure, nil, "libvirt is not configured for this daemon")
	}
	if _, err := m.lv().Domain(ctx, domain); err != nil {
		return store.Instance{}, store.Attachment{}, classifyVirt(err, "attach a new %s to VM %s", req.Profile, domain)
	}
	opts.Tenant = ""
	if req.UUID == "" {
		req.UUID = uuid.NewString()
	} else {
		if err := m.refuseForeignUUID(ctx, req.UUID); err != nil {
			return store.Instance{}, store.Attachment{}, err
		}
		if _, err := m.Instance(req.UUID); err == nil {
			rec, err := m.Create(ctx, req) // checks tenant and profile match
			if err != nil {
				return store.Instance{}, store.Attachment{}, err
			}
			a, err := m.Attach(ctx, rec.UUID, domain, opts)
			if err != nil {
				return store.Instance{}, store.Attachment{}, err
			}
			return rec, a, nil
		}
	}
	span := uuid.NewString()
	defer m.inflight.add(span, req.UUID)()
	payload, _ := json.Marshal(newAttachPayload(domain, opts)) // strings and bools: cannot fail
	if err := m.db.Update(func(tx *store.Tx) error {
		return tx.PutIntent(store.Intent{ID: span, Op: store.OpCreateAttach, Instance: req.UUID, Payload: payload, Started: m.now()})
	}); err != nil {
		return store.Instance{}, store.Attachment{}, classify(err, "create and attach %s", req.UUID)
	}
	dropSpan := func() {
		if err := m.db.Update(func(tx *store.Tx) error { return tx.DeleteIntent(span) }); err != nil {
			m.log.Error("drop create-and-attach intent", "instance", req.UUID, "err", err)
		}
	}
	rec, err := m.Create(ctx, req)
	if err != nil {
		dropSpan()
		return store.Instance{}, store.Attachment{}, err
	}
	m.crash(CrashCreateAttach)
	a, err := m.Attach(ctx, rec.UUID, domain, opts)
	if err != nil {
		if derr := m.Destroy(context.WithoutCancel(ctx), rec.UUID, DestroyOptions{}); derr != nil {
			// The intent stays: reconcile destroys the instance later.
			m.log.Error("undo create after failed attach; reconcile retries", "instance", rec.UUID, "err", derr)
			return store.Instance{}, store.Attachment{}, err
		}
		dropSpan()
		return store.Instance{}, store.Attachment{}, err
	}
	dropSpan()
	return rec, a, nil
}
