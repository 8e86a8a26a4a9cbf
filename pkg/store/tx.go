package store

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	bbolt "go.etcd.io/bbolt"
)

// Tx is one transaction, valid only inside the View or Update call that
// made it. Writes in a View fail. Getters return ErrNotFound (wrapped with
// the kind and key) for a missing record and ErrCorrupt for one that does
// not decode. Deletes of a missing record succeed, so a repeated undo step
// is harmless.
type Tx struct {
	tx  *bbolt.Tx
	now func() time.Time
}

// Tenant returns the tenant named name.
func (t *Tx) Tenant(name string) (Tenant, error) {
	var rec Tenant
	return rec, t.get(bucketTenants, "tenant", name, &rec)
}

// Tenants returns every tenant, sorted by name.
func (t *Tx) Tenants() ([]Tenant, error) {
	return list[Tenant](t, bucketTenants, "tenant")
}

// PutTenant creates or replaces a tenant after tenant.Tenant.Validate. A
// non-zero rec.Generation must equal the stored one (ErrConflict
// otherwise; zero puts unconditionally). On success rec.Generation is the
// new generation; it is only durable once the transaction commits.
func (t *Tx) PutTenant(rec *Tenant) error {
	if err := rec.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	var old Tenant
	exists, err := t.lookup(bucketTenants, "tenant", rec.Name, &old)
	if err != nil {
		return err
	}
	if err := checkGeneration("tenant", rec.Name, rec.Generation, old.Generation, exists); err != nil {
		return err
	}
	next := *rec
	next.Generation = old.Generation + 1
	if err := t.put(bucketTenants, "tenant", rec.Name, &next); err != nil {
		return err
	}
	rec.Generation = next.Generation
	return nil
}

// DeleteTenant deletes a tenant. It fails with ErrInUse while the tenant
// holds instances.
func (t *Tx) DeleteTenant(name string) error {
	c := t.tx.Bucket([]byte(bucketByTenant)).Cursor()
	prefix := tenantPrefix(name)
	if k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) {
		return fmt.Errorf("tenant %q: %w: it holds instance %s and maybe more: destroy them first",
			name, ErrInUse, k[len(prefix):])
	}
	return t.delete(bucketTenants, "tenant", name)
}

// Instance returns the instance with UUID uuid.
func (t *Tx) Instance(uuid string) (Instance, error) {
	var rec Instance
	return rec, t.get(bucketInstances, "instance", uuid, &rec)
}

// Instances returns every instance, sorted by UUID.
func (t *Tx) Instances() ([]Instance, error) {
	return list[Instance](t, bucketInstances, "instance")
}

// InstancesOf returns the instances of tenant name, sorted by UUID, or
// ErrNotFound when there is no such tenant.
func (t *Tx) InstancesOf(name string) ([]Instance, error) {
	if t.tx.Bucket([]byte(bucketTenants)).Get([]byte(name)) == nil {
		return nil, fmt.Errorf("tenant %q: %w", name, ErrNotFound)
	}
	var out []Instance
	prefix := tenantPrefix(name)
	c := t.tx.Bucket([]byte(bucketByTenant)).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		uuid := string(k[len(prefix):])
		var rec Instance
		if err := t.get(bucketInstances, "instance", uuid, &rec); err != nil {
			return nil, fmt.Errorf("%w: index of tenant %q: %w", ErrCorrupt, name, err)
		}
		out = append(out, rec)
	}
	return out, nil
}

// PutInstance creates or replaces an instance. Its tenant must exist
// (ErrNotFound otherwise); the record is validated (ErrInvalid) and its
// Generation handled as in PutTenant.
func (t *Tx) PutInstance(rec *Instance) error {
	if err := rec.validate(); err != nil {
		return err
	}
	if t.tx.Bucket([]byte(bucketTenants)).Get([]byte(rec.Tenant)) == nil {
		return fmt.Errorf("instance %s: tenant %q: %w", rec.UUID, rec.Tenant, ErrNotFound)
	}
	var old Instance
	exists, err := t.lookup(bucketInstances, "instance", rec.UUID, &old)
	if err != nil {
		return err
	}
	if err := checkGeneration("instance", rec.UUID, rec.Generation, old.Generation, exists); err != nil {
		return err
	}
	index := t.tx.Bucket([]byte(bucketByTenant))
	if exists && old.Tenant != rec.Tenant {
		if err := index.Delete(indexKey(old.Tenant, rec.UUID)); err != nil {
			return fmt.Errorf("store: unindex instance %s: %w", rec.UUID, err)
		}
	}
	if err := index.Put(indexKey(rec.Tenant, rec.UUID), nil); err != nil {
		return fmt.Errorf("store: index instance %s: %w", rec.UUID, err)
	}
	next := *rec
	next.Generation = old.Generation + 1
	if err := t.put(bucketInstances, "instance", rec.UUID, &next); err != nil {
		return err
	}
	rec.Generation = next.Generation
	return nil
}

// DeleteInstance deletes an instance. It fails with ErrInUse while the
// instance has an attachment.
func (t *Tx) DeleteInstance(uuid string) error {
	if a := t.tx.Bucket([]byte(bucketAttachments)).Get([]byte(uuid)); a != nil {
		return fmt.Errorf("instance %s: %w: it is attached: delete the attachment first", uuid, ErrInUse)
	}
	var old Instance
	exists, err := t.lookup(bucketInstances, "instance", uuid, &old)
	if err != nil || !exists {
		return err
	}
	if err := t.tx.Bucket([]byte(bucketByTenant)).Delete(indexKey(old.Tenant, uuid)); err != nil {
		return fmt.Errorf("store: unindex instance %s: %w", uuid, err)
	}
	return t.delete(bucketInstances, "instance", uuid)
}

// Attachment returns the attachment of instance uuid.
func (t *Tx) Attachment(instance string) (Attachment, error) {
	var rec Attachment
	return rec, t.get(bucketAttachments, "attachment", instance, &rec)
}

// Attachments returns every attachment, sorted by instance UUID.
func (t *Tx) Attachments() ([]Attachment, error) {
	return list[Attachment](t, bucketAttachments, "attachment")
}

// PutAttachment creates or replaces the attachment of a.Instance, which
// must exist (ErrNotFound otherwise).
func (t *Tx) PutAttachment(a Attachment) error {
	if err := a.validate(); err != nil {
		return err
	}
	if t.tx.Bucket([]byte(bucketInstances)).Get([]byte(a.Instance)) == nil {
		return fmt.Errorf("attachment: instance %s: %w", a.Instance, ErrNotFound)
	}
	return t.put(bucketAttachments, "attachment", a.Instance, &a)
}

// DeleteAttachment deletes the attachment of instance uuid.
func (t *Tx) DeleteAttachment(instance string) error {
	return t.delete(bucketAttachments, "attachment", instance)
}

// GPU returns the stored state of the GPU with UUID uuid.
func (t *Tx) GPU(uuid string) (GPU, error) {
	var rec GPU
	return rec, t.get(bucketGPUs, "gpu", uuid, &rec)
}

// GPUs returns every stored GPU state, sorted by UUID.
func (t *Tx) GPUs() ([]GPU, error) {
	return list[GPU](t, bucketGPUs, "gpu")
}

// PutGPU stores a GPU's state, stamping Updated; a state that holds
// nothing (Zero) deletes the record.
func (t *Tx) PutGPU(g GPU) error {
	if g.UUID == "" {
		return fmt.Errorf("%w: GPU state without a UUID", ErrInvalid)
	}
	if g.Zero() {
		return t.delete(bucketGPUs, "gpu", g.UUID)
	}
	g.Updated = t.now()
	return t.put(bucketGPUs, "gpu", g.UUID, &g)
}

// Intent returns the intent with ID id.
func (t *Tx) Intent(id string) (Intent, error) {
	var rec Intent
	return rec, t.get(bucketIntents, "intent", id, &rec)
}

// Intents returns every intent in the order they started (then by ID),
// the order reconcile replays them in.
func (t *Tx) Intents() ([]Intent, error) {
	out, err := list[Intent](t, bucketIntents, "intent")
	slices.SortStableFunc(out, func(a, b Intent) int {
		return cmp.Or(a.Started.Compare(b.Started), cmp.Compare(a.ID, b.ID))
	})
	return out, err
}

// PutIntent creates or replaces an intent.
func (t *Tx) PutIntent(it Intent) error {
	if err := it.validate(); err != nil {
		return err
	}
	return t.put(bucketIntents, "intent", it.ID, &it)
}

// AppendStep records that intent id finished step and stamps Updated. A
// step already recorded is not appended again (nor Updated touched), so
// a retried step is recorded once.
func (t *Tx) AppendStep(id, step string) error {
	if step == "" {
		return fmt.Errorf("%w: intent %s: empty step name", ErrInvalid, id)
	}
	it, err := t.Intent(id)
	if err != nil {
		return err
	}
	if slices.Contains(it.Steps, step) {
		return nil
	}
	it.Steps = append(it.Steps, step)
	it.Updated = t.now()
	return t.put(bucketIntents, "intent", id, &it)
}

// DeleteIntent deletes an intent.
func (t *Tx) DeleteIntent(id string) error {
	return t.delete(bucketIntents, "intent", id)
}

// lookup decodes the record at key into v and reports whether it exists.
func (t *Tx) lookup(bucket, kind, key string, v any) (bool, error) {
	data := t.tx.Bucket([]byte(bucket)).Get([]byte(key))
	if data == nil {
		return false, nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return true, fmt.Errorf("%w: %s %q: %w", ErrCorrupt, kind, key, err)
	}
	return true, nil
}

func (t *Tx) get(bucket, kind, key string, v any) error {
	exists, err := t.lookup(bucket, kind, key, v)
	if err == nil && !exists {
		err = fmt.Errorf("%s %q: %w", kind, key, ErrNotFound)
	}
	return err
}

func (t *Tx) put(bucket, kind, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("%w: %s %q: %w", ErrInvalid, kind, key, err)
	}
	if err := t.tx.Bucket([]byte(bucket)).Put([]byte(key), data); err != nil {
		return fmt.Errorf("store: put %s %q: %w", kind, key, err)
	}
	return nil
}

func (t *Tx) delete(bucket, kind, key string) error {
	if err := t.tx.Bucket([]byte(bucket)).Delete([]byte(key)); err != nil {
		return fmt.Errorf("store: delete %s %q: %w", kind, key, err)
	}
	return nil
}

// list decodes every record in bucket, in key order.
func list[T any](t *Tx, bucket, kind string) ([]T, error) {
	var out []T
	err := t.tx.Bucket([]byte(bucket)).ForEach(func(k, data []byte) error {
		var rec T
		if err := json.Unmarshal(data, &rec); err != nil {
			return fmt.Errorf("%w: %s %q: %w", ErrCorrupt, kind, k, err)
		}
		out = append(out, rec)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func checkGeneration(kind, key string, got, stored uint64, exists bool) error {
	switch {
	case got == 0:
		return nil
	case !exists:
		return fmt.Errorf("%s %q: %w: put with generation %d, but there is no stored record: re-read it", kind, key, ErrConflict, got)
	case got != stored:
		return fmt.Errorf("%s %q: %w: put with generation %d, stored is %d: re-read it and retry", kind, key, ErrConflict, got, stored)
	}
	return nil
}

func tenantPrefix(name string) []byte {
	return append([]byte(name), 0)
}

func indexKey(tenant, uuid string) []byte {
	return append(tenantPrefix(tenant), uuid...)
}
