package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/vgpud/vgpud/pkg/tenant"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func openTest(t testing.TB, opts Options) *DB {
	t.Helper()
	db, err := Open(filepath.Join(t.TempDir(), "state.db"), opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func testTenant(name string) Tenant {
	return Tenant{Tenant: tenant.Tenant{
		Name:          name,
		Quota:         tenant.Quota{VRAMBytes: 80 << 30, ComputeMilli: 2500, MaxInstances: tenant.Unlimited},
		AllowedModels: []string{"H100-SXM5-80GB"},
		Class:         tenant.Guaranteed,
		Created:       t0,
	}}
}

func testInstance(uuid, owner string) Instance {
	return Instance{
		UUID: uuid, Tenant: owner, Kind: KindMIG, Profile: "3g.40gb", Model: "H100-SXM5-80GB",
		GPUUUID: "GPU-0a1b", GPUPCI: "0000:17:00.0",
		GIProfileID: 9, GIStart: 4, GISize: 4, GIID: 2, CIProfileID: 2, CIID: 0,
		TypeID:    -1,
		VRAMBytes: 40 << 30, ComputeMilli: 428,
		State: StateReady, Created: t0, Updated: t0,
	}
}

// mustUpdate and mustView fail the test on error.
func mustUpdate(t testing.TB, db *DB, fn func(*Tx) error) {
	t.Helper()
	if err := db.Update(fn); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

func mustView(t testing.TB, db *DB, fn func(*Tx) error) {
	t.Helper()
	if err := db.View(fn); err != nil {
		t.Fatalf("View: %v", err)
	}
}

func TestOpenCreates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if db.SchemaVersion() != SchemaVersion || db.Path() != path {
		t.Errorf("SchemaVersion, Path = %d, %s; want %d, %s", db.SchemaVersion(), db.Path(), SchemaVersion, path)
	}
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("mode %v, want 0600", perm)
	}
	if got, want := rawSchema(t, path), strconv.Itoa(SchemaVersion); got != want {
		t.Errorf("meta/schema = %q, want %q", got, want)
	}
	db, err = Open(path, Options{})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	_ = db.Close()
}

func TestPersistsAcrossReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	tn, in := testTenant("acme"), testInstance("i-1", "acme")
	mustUpdate(t, db, func(tx *Tx) error {
		if err := tx.PutTenant(&tn); err != nil {
			return err
		}
		return tx.PutInstance(&in)
	})
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mustView(t, db, func(tx *Tx) error {
		got, err := tx.Instance("i-1")
		if err != nil {
			return err
		}
		if !reflect.DeepEqual(got, in) {
			t.Errorf("after reopen got %+v, want %+v", got, in)
		}
		return nil
	})
}

func TestTenantCRUD(t *testing.T) {
	db := openTest(t, Options{})
	acme, beta := testTenant("acme"), testTenant("beta")
	mustUpdate(t, db, func(tx *Tx) error {
		if err := tx.PutTenant(&beta); err != nil {
			return err
		}
		return tx.PutTenant(&acme)
	})
	if acme.Generation != 1 {
		t.Errorf("Generation after create = %d, want 1", acme.Generation)
	}
	mustView(t, db, func(tx *Tx) error {
		got, err := tx.Tenant("acme")
		if err != nil {
			return err
		}
		if !reflect.DeepEqual(got, acme) {
			t.Errorf("Tenant = %+v, want %+v", got, acme)
		}
		all, err := tx.Tenants()
		if err != nil {
			return err
		}
		if len(all) != 2 || all[0].Name != "acme" || all[1].Name != "beta" {
			t.Errorf("Tenants = %+v, want acme, beta", all)
		}
		return nil
	})

	acme.Quota.VRAMBytes = 160 << 30
	mustUpdate(t, db, func(tx *Tx) error { return tx.PutTenant(&acme) })
	if acme.Generation != 2 {
		t.Errorf("Generation after update = %d, want 2", acme.Generation)
	}

	mustUpdate(t, db, func(tx *Tx) error { return tx.DeleteTenant("acme") })
	mustUpdate(t, db, func(tx *Tx) error { return tx.DeleteTenant("acme") }) // deleting again is harmless
	err := db.View(func(tx *Tx) error {
		_, err := tx.Tenant("acme")
		return err
	})
	if !errors.Is(err, ErrNotFound) || err.Error() != `tenant "acme": not found` {
		t.Errorf("Tenant after delete: %v, want ErrNotFound", err)
	}
}

func TestPutTenantRefuses(t *testing.T) {
	db := openTest(t, Options{})
	stored := testTenant("acme")
	mustUpdate(t, db, func(tx *Tx) error { return tx.PutTenant(&stored) })

	tests := []struct {
		name   string
		mutate func(*Tenant)
		want   []error
	}{
		{"bad name", func(tn *Tenant) { tn.Name = "Acme" }, []error{ErrInvalid, tenant.ErrInvalidName}},
		{"bad class", func(tn *Tenant) { tn.Class = "gold" }, []error{ErrInvalid, tenant.ErrInvalidTenant}},
		{"stale generation", func(tn *Tenant) { tn.Generation = 7 }, []error{ErrConflict}},
		{"generation without record", func(tn *Tenant) { tn.Name = "new"; tn.Generation = 1 }, []error{ErrConflict}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tn := stored
			tc.mutate(&tn)
			err := db.Update(func(tx *Tx) error { return tx.PutTenant(&tn) })
			for _, want := range tc.want {
				if !errors.Is(err, want) {
					t.Errorf("PutTenant = %v, want %v", err, want)
				}
			}
		})
	}
	// The matching generation is accepted.
	tn := stored
	mustUpdate(t, db, func(tx *Tx) error { return tx.PutTenant(&tn) })
	if tn.Generation != stored.Generation+1 {
		t.Errorf("Generation = %d, want %d", tn.Generation, stored.Generation+1)
	}
}

func TestInstanceCRUD(t *testing.T) {
	db := openTest(t, Options{})
	acme, beta := testTenant("acme"), testTenant("beta")
	a1, a2, b1 := testInstance("a1", "acme"), testInstance("a2", "acme"), testInstance("b1", "beta")
	b1.Kind, b1.Flow, b1.TypeID, b1.TypeName, b1.VF = KindVGPU, FlowVFIO, 1042, "NVIDIA H100-4Q", "0000:17:00.4"
	b1.GIProfileID, b1.GIStart, b1.GISize, b1.GIID, b1.CIProfileID, b1.CIID = -1, -1, -1, -1, -1, -1

	err := db.Update(func(tx *Tx) error { return tx.PutInstance(&a1) })
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("PutInstance without tenant = %v, want ErrNotFound", err)
	}
	mustUpdate(t, db, func(tx *Tx) error {
		for _, tn := range []*Tenant{&acme, &beta} {
			if err := tx.PutTenant(tn); err != nil {
				return err
			}
		}
		for _, in := range []*Instance{&a2, &b1, &a1} {
			if err := tx.PutInstance(in); err != nil {
				return err
			}
		}
		return nil
	})
	mustView(t, db, func(tx *Tx) error {
		got, err := tx.Instance("b1")
		if err != nil {
			return err
		}
		if !reflect.DeepEqual(got, b1) || got.Generation != 1 {
			t.Errorf("Instance = %+v, want %+v at generation 1", got, b1)
		}
		all, err := tx.Instances()
		if err != nil {
			return err
		}
		if ids := uuids(all); !reflect.DeepEqual(ids, []string{"a1", "a2", "b1"}) {
			t.Errorf("Instances = %v, want a1 a2 b1", ids)
		}
		of, err := tx.InstancesOf("acme")
		if err != nil {
			return err
		}
		if ids := uuids(of); !reflect.DeepEqual(ids, []string{"a1", "a2"}) {
			t.Errorf("InstancesOf(acme) = %v, want a1 a2", ids)
		}
		if _, err := tx.InstancesOf("nobody"); !errors.Is(err, ErrNotFound) {
			t.Errorf("InstancesOf(nobody) = %v, want ErrNotFound", err)
		}
		return nil
	})

	// Moving an instance to another tenant moves it in the index too.
	a2.Tenant = "beta"
	mustUpdate(t, db, func(tx *Tx) error { return tx.PutInstance(&a2) })
	mustView(t, db, func(tx *Tx) error {
		for name, want := range map[string][]string{"acme": {"a1"}, "beta": {"a2", "b1"}} {
			of, err := tx.InstancesOf(name)
			if err != nil {
				return err
			}
			if ids := uuids(of); !reflect.DeepEqual(ids, want) {
				t.Errorf("InstancesOf(%s) after move = %v, want %v", name, ids, want)
			}
		}
		return nil
	})
	if a2.Generation != 2 {
		t.Errorf("Generation after update = %d, want 2", a2.Generation)
	}

	if err := db.Update(func(tx *Tx) error { return tx.DeleteTenant("acme") }); !errors.Is(err, ErrInUse) {
		t.Errorf("DeleteTenant with instances = %v, want ErrInUse", err)
	}
	mustUpdate(t, db, func(tx *Tx) error {
		if err := tx.DeleteInstance("a1"); err != nil {
			return err
		}
		if err := tx.DeleteInstance("a1"); err != nil { // deleting again is harmless
			return err
		}
		return tx.DeleteTenant("acme")
	})
	mustView(t, db, func(tx *Tx) error {
		if _, err := tx.Instance("a1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("Instance after delete = %v, want ErrNotFound", err)
		}
		of, err := tx.InstancesOf("beta")
		if err != nil {
			return err
		}
		if ids := uuids(of); !reflect.DeepEqual(ids, []string{"a2", "b1"}) {
			t.Errorf("InstancesOf(beta) = %v, want a2 b1", ids)
		}
		return nil
	})
}

func uuids(ins []Instance) []string {
	var out []string
	for _, in := range ins {
		out = append(out, in.UUID)
	}
	return out
}

func TestPutInstanceRefuses(t *testing.T) {
	db := openTest(t, Options{})
	acme := testTenant("acme")
	stored := testInstance("i-1", "acme")
	mustUpdate(t, db, func(tx *Tx) error {
		if err := tx.PutTenant(&acme); err != nil {
			return err
		}
		return tx.PutInstance(&stored)
	})
	tests := []struct {
		name   string
		mutate func(*Instance)
		want   error
	}{
		{"no UUID", func(in *Instance) { in.UUID = "" }, ErrInvalid},
		{"no tenant", func(in *Instance) { in.Tenant = "" }, ErrInvalid},
		{"unknown tenant", func(in *Instance) { in.Tenant = "nobody" }, ErrNotFound},
		{"bad kind", func(in *Instance) { in.Kind = "container" }, ErrInvalid},
		{"bad state", func(in *Instance) { in.State = "running" }, ErrInvalid},
		{"bad flow", func(in *Instance) { in.Flow = "sriov" }, ErrInvalid},
		{"stale generation", func(in *Instance) { in.Generation = 5 }, ErrConflict},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := stored
			tc.mutate(&in)
			if err := db.Update(func(tx *Tx) error { return tx.PutInstance(&in) }); !errors.Is(err, tc.want) {
				t.Errorf("PutInstance = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestAttachmentCRUD(t *testing.T) {
	db := openTest(t, Options{})
	acme, in := testTenant("acme"), testInstance("i-1", "acme")
	att := Attachment{Instance: "i-1", Domain: "vm1", DomainUUID: "3c5e3b6a-6f0e-4c7b-9a59-1d2e3f405162", URI: "qemu:///system", Live: true, Created: t0}

	if err := db.Update(func(tx *Tx) error { return tx.PutAttachment(att) }); !errors.Is(err, ErrNotFound) {
		t.Fatalf("PutAttachment without instance = %v, want ErrNotFound", err)
	}
	if err := db.Update(func(tx *Tx) error { return tx.PutAttachment(Attachment{Instance: "i-1"}) }); !errors.Is(err, ErrInvalid) {
		t.Fatalf("PutAttachment without domain = %v, want ErrInvalid", err)
	}
	mustUpdate(t, db, func(tx *Tx) error {
		if err := tx.PutTenant(&acme); err != nil {
			return err
		}
		if err := tx.PutInstance(&in); err != nil {
			return err
		}
		return tx.PutAttachment(att)
	})
	// At most one per instance: a second put replaces the first.
	att.Live = false
	mustUpdate(t, db, func(tx *Tx) error { return tx.PutAttachment(att) })
	mustView(t, db, func(tx *Tx) error {
		got, err := tx.Attachment("i-1")
		if err != nil {
			return err
		}
		if !reflect.DeepEqual(got, att) {
			t.Errorf("Attachment = %+v, want %+v", got, att)
		}
		all, err := tx.Attachments()
		if err != nil {
			return err
		}
		if len(all) != 1 || !reflect.DeepEqual(all[0], att) {
			t.Errorf("Attachments = %+v, want [%+v]", all, att)
		}
		return nil
	})
	if err := db.Update(func(tx *Tx) error { return tx.DeleteInstance("i-1") }); !errors.Is(err, ErrInUse) {
		t.Errorf("DeleteInstance while attached = %v, want ErrInUse", err)
	}
	mustUpdate(t, db, func(tx *Tx) error {
		if err := tx.DeleteAttachment("i-1"); err != nil {
			return err
		}
		return tx.DeleteInstance("i-1")
	})
	mustView(t, db, func(tx *Tx) error {
		if _, err := tx.Attachment("i-1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("Attachment after delete = %v, want ErrNotFound", err)
		}
		return nil
	})
}

func TestIntentCRUD(t *testing.T) {
	clock := t0
	db := openTest(t, Options{Now: func() time.Time { return clock }})
	create := Intent{ID: "op-2", Op: OpCreate, Instance: "i-1", Payload: json.RawMessage(`{"profile":"3g.40gb","gpu":"GPU-0a1b"}`), Started: t0}
	destroy := Intent{ID: "op-1", Op: OpDestroy, Instance: "i-0", Started: t0.Add(time.Second)}
	mustUpdate(t, db, func(tx *Tx) error {
		if err := tx.PutIntent(destroy); err != nil {
			return err
		}
		return tx.PutIntent(create)
	})

	clock = t0.Add(time.Minute)
	mustUpdate(t, db, func(tx *Tx) error {
		for _, step := range []string{"admit", "place", "admit", "create-gi"} {
			if err := tx.AppendStep("op-2", step); err != nil {
				return err
			}
		}
		return nil
	})
	clock = t0.Add(time.Hour)
	mustUpdate(t, db, func(tx *Tx) error { return tx.AppendStep("op-2", "place") }) // a retried step
	mustView(t, db, func(tx *Tx) error {
		got, err := tx.Intent("op-2")
		if err != nil {
			return err
		}
		want := create
		want.Steps = []string{"admit", "place", "create-gi"}
		want.Updated = t0.Add(time.Minute)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Intent = %+v\nwant %+v", got, want)
		}
		all, err := tx.Intents()
		if err != nil {
			return err
		}
		// Ordered by start, not by ID.
		if len(all) != 2 || all[0].ID != "op-2" || all[1].ID != "op-1" {
			t.Errorf("Intents = %+v, want op-2 then op-1", all)
		}
		return nil
	})

	if err := db.Update(func(tx *Tx) error { return tx.AppendStep("op-9", "admit") }); !errors.Is(err, ErrNotFound) {
		t.Errorf("AppendStep of a missing intent = %v, want ErrNotFound", err)
	}
	for name, fn := range map[string]func(*Tx) error{
		"empty step":       func(tx *Tx) error { return tx.AppendStep("op-2", "") },
		"no ID":            func(tx *Tx) error { return tx.PutIntent(Intent{Op: OpCreate}) },
		"bad op":           func(tx *Tx) error { return tx.PutIntent(Intent{ID: "x", Op: "resize"}) },
		"payload not JSON": func(tx *Tx) error { return tx.PutIntent(Intent{ID: "x", Op: OpCreate, Payload: json.RawMessage("{")}) },
	} {
		if err := db.Update(fn); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s = %v, want ErrInvalid", name, err)
		}
	}

	mustUpdate(t, db, func(tx *Tx) error { return tx.DeleteIntent("op-2") })
	mustView(t, db, func(tx *Tx) error {
		if _, err := tx.Intent("op-2"); !errors.Is(err, ErrNotFound) {
			t.Errorf("Intent after delete = %v, want ErrNotFound", err)
		}
		return nil
	})
}

func TestUpdateIsAtomic(t *testing.T) {
	errBoom := errors.New("boom")
	tests := []struct {
		name string
		end  func() error // how the transaction ends after its writes
	}{
		{"error", func() error { return errBoom }},
		{"panic", func() error { panic(errBoom) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			db := openTest(t, Options{})
			keep := testTenant("keep")
			mustUpdate(t, db, func(tx *Tx) error { return tx.PutTenant(&keep) })

			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						err = r.(error)
					}
				}()
				err = db.Update(func(tx *Tx) error {
					acme, in := testTenant("acme"), testInstance("i-1", "acme")
					if err := tx.PutTenant(&acme); err != nil {
						return err
					}
					if err := tx.PutInstance(&in); err != nil {
						return err
					}
					if err := tx.PutIntent(Intent{ID: "op-1", Op: OpCreate, Instance: "i-1", Started: t0}); err != nil {
						return err
					}
					if err := tx.DeleteTenant("keep"); err != nil {
						return err
					}
					return tc.end()
				})
			}()
			if !errors.Is(err, errBoom) {
				t.Fatalf("Update = %v, want the function's error", err)
			}
			mustView(t, db, func(tx *Tx) error {
				tenants, err := tx.Tenants()
				if err != nil {
					return err
				}
				instances, err := tx.Instances()
				if err != nil {
					return err
				}
				intents, err := tx.Intents()
				if err != nil {
					return err
				}
				if len(tenants) != 1 || tenants[0].Name != "keep" || len(instances) != 0 || len(intents) != 0 {
					t.Errorf("after rollback: tenants %v, instances %v, intents %v; want only tenant keep", tenants, instances, intents)
				}
				return nil
			})
			// The database still takes writes.
			mustUpdate(t, db, func(tx *Tx) error { acme := testTenant("acme"); return tx.PutTenant(&acme) })
		})
	}
}

func TestWriteInViewFails(t *testing.T) {
	db := openTest(t, Options{})
	err := db.View(func(tx *Tx) error { tn := testTenant("acme"); return tx.PutTenant(&tn) })
	if !errors.Is(err, berrors.ErrTxNotWritable) {
		t.Errorf("PutTenant in View = %v, want berrors.ErrTxNotWritable", err)
	}
}

func TestUndecodableRecord(t *testing.T) {
	db := openTest(t, Options{})
	if err := db.bolt.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte(bucketInstances)).Put([]byte("i-bad"), []byte("{not json"))
	}); err != nil {
		t.Fatal(err)
	}
	for name, fn := range map[string]func(*Tx) error{
		"Instance":  func(tx *Tx) error { _, err := tx.Instance("i-bad"); return err },
		"Instances": func(tx *Tx) error { _, err := tx.Instances(); return err },
	} {
		if err := db.View(fn); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s = %v, want ErrCorrupt", name, err)
		}
	}
}

func BenchmarkPutInstance(b *testing.B) {
	db := openTest(b, Options{})
	acme := testTenant("acme")
	mustUpdate(b, db, func(tx *Tx) error { return tx.PutTenant(&acme) })
	ins := make([]Instance, 384)
	for i := range ins {
		ins[i] = testInstance(fmt.Sprintf("inst-%04d", i), "acme")
	}
	for i := 0; b.Loop(); i++ {
		in := &ins[i%len(ins)]
		mustUpdate(b, db, func(tx *Tx) error { return tx.PutInstance(in) })
	}
}

func BenchmarkListInstances(b *testing.B) {
	db := openTest(b, Options{})
	mustUpdate(b, db, func(tx *Tx) error {
		for i := range 8 {
			tn := testTenant(fmt.Sprintf("tenant-%d", i))
			if err := tx.PutTenant(&tn); err != nil {
				return err
			}
		}
		for i := range 384 {
			in := testInstance(fmt.Sprintf("inst-%04d", i), fmt.Sprintf("tenant-%d", i%8))
			if err := tx.PutInstance(&in); err != nil {
				return err
			}
		}
		return nil
	})
	b.Run("all", func(b *testing.B) {
		for b.Loop() {
			mustView(b, db, func(tx *Tx) error {
				all, err := tx.Instances()
				if err == nil && len(all) != 384 {
					err = fmt.Errorf("%d instances, want 384", len(all))
				}
				return err
			})
		}
	})
	b.Run("of-tenant", func(b *testing.B) {
		for b.Loop() {
			mustView(b, db, func(tx *Tx) error {
				of, err := tx.InstancesOf("tenant-3")
				if err == nil && len(of) != 48 {
					err = fmt.Errorf("%d instances, want 48", len(of))
				}
				return err
			})
		}
	})
}

// BenchmarkOpen measures start-up on a file with 384 instances: the
// read-only inspection (every page read, tx.Check) and the locked open.
func BenchmarkOpen(b *testing.B) {
	path := filepath.Join(b.TempDir(), "state.db")
	db, err := Open(path, Options{})
	if err != nil {
		b.Fatal(err)
	}
	mustUpdate(b, db, func(tx *Tx) error {
		acme := testTenant("acme")
		if err := tx.PutTenant(&acme); err != nil {
			return err
		}
		for i := range 384 {
			in := testInstance(fmt.Sprintf("inst-%04d", i), "acme")
			if err := tx.PutInstance(&in); err != nil {
				return err
			}
		}
		return nil
	})
	if err := db.Close(); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		db, err := Open(path, Options{})
		if err != nil {
			b.Fatal(err)
		}
		if err := db.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
