package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/store"
)

// A moving VM's allocation in the fleet (docs/fleet.md, "Moving a VM"),
// as Nova moves it: MigrationSource moves the source instance's
// allocation from the instance's UUID to a migration consumer, in one
// Placement request (Fleet.Move), so that the instance's UUID is free for
// the destination, whose PrepareIncoming claims it before carving (the
// claim of a local create). CompleteOutgoing removes the migration
// consumer's allocation with the released instance; CancelOutgoing (and a
// reconcile that finds the VM stayed) moves it back to the instance. The
// record names the consumer holding its allocation
// (store.Instance.MigrationConsumer) from the outgoing intent to the end,
// so the sync writes the allocation under it and never under the
// instance's UUID, which the destination holds. A Placement that does not
// answer fails none of these calls: the sync makes it follow the records.

// migrationConsumer is the Placement consumer of instance's outgoing
// migration intent: derived from both, so a restart and a repeated call
// name the same one, and each migration of the instance its own.
func migrationConsumer(instance, intent string) string {
	ns, err := uuid.Parse(instance)
	if err != nil {
		ns = uuid.Nil
	}
	return uuid.NewSHA1(ns, []byte("vgpud-migration:"+intent)).String()
}

// fleetConsumer is the Placement consumer holding rec's allocation.
func fleetConsumer(rec *store.Instance) string {
	if rec.MigrationConsumer != "" {
		return rec.MigrationConsumer
	}
	return rec.UUID
}

// HasConsumer reports whether consumer id holds the allocation of an
// instance of this host now: the instance's UUID, or while its VM moves
// to another host the migration's consumer (the instance's UUID then holds
// nothing here: it is the destination's).
func (m *Manager) HasConsumer(id string) bool {
	found := false
	_ = m.db.View(func(tx *store.Tx) error { // an unreadable store holds nothing
		rec, err := tx.Instance(id)
		if err == nil {
			found = rec.MigrationConsumer == ""
			return nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		all, err := tx.Instances()
		if err != nil {
			return err
		}
		for i := range all {
			if all[i].MigrationConsumer == id {
				found = true
			}
		}
		return nil
	})
	return found
}

// fleetMove moves what consumer from holds on this host's providers to
// consumer to. A fleet that cannot do it now fails nothing: the sync
// makes Placement follow the records (from's allocation goes, to's is
// written), and the caller is told Placement lags.
func (m *Manager) fleetMove(ctx context.Context, from, to, what string) {
	f := m.fleetOf()
	if f == nil {
		return
	}
	if err := f.Move(ctx, from, to); err != nil {
		m.log.Warn("placement allocation not moved; the sync moves it", "from", from, "to", to, "err", err)
		notePlacementBehind(ctx, fmt.Sprintf("%s not moved in Placement (%s); the sync's next pass does it", what, Message(err)))
	}
}

// moveOutgoing moves instance u's allocation to the migration's consumer
// while the record still names it: one at a time with the calls that end
// a migration (migEnd), so that a CancelOutgoing that moved it back is
// not undone by this move coming late.
func (m *Manager) moveOutgoing(ctx context.Context, u, consumer string) {
	if consumer == "" {
		return
	}
	m.migEnd.Lock()
	defer m.migEnd.Unlock()
	still := false
	_ = m.db.View(func(tx *store.Tx) error { // unreadable: nothing moves, the sync follows the record
		r, err := tx.Instance(u)
		still = err == nil && r.MigrationConsumer == consumer
		return err
	})
	if still {
		m.fleetMove(ctx, u, consumer, "the allocation of instance "+u)
	}
}

// fleetForget leaves the removal of consumer's allocation here to the
// fleet's next pass (reconcile, under the admission lock, waits on no
// fleet call).
func (m *Manager) fleetForget(consumer string) {
	if f := m.fleetOf(); f != nil && consumer != "" {
		f.Unclaim(consumer)
	}
}

// beginOutgoing records an outgoing migration of instance u whose VM
// att holds it, with payload, in transaction tx: the intent, and the
// record's migration consumer, which holds its allocation from now on.
func beginOutgoing(tx *store.Tx, it store.Intent, u string) error {
	r, err := tx.Instance(u)
	if err != nil {
		return err
	}
	var p outgoingPayload
	_ = json.Unmarshal(it.Payload, &p) // written by MigrationSource just now
	r.MigrationConsumer = p.Consumer
	if err := tx.PutInstance(&r); err != nil {
		return err
	}
	return tx.PutIntent(it)
}

// keepOutgoing ends the outgoing migration it of instance u whose VM
// stayed: in one transaction the intent goes and the instance's
// allocation is its own UUID's again. It returns the consumer that held
// it ("" none).
func (m *Manager) keepOutgoing(it store.Intent, u string) (string, error) {
	var moved string
	err := m.db.Update(func(tx *store.Tx) error {
		if r, err := tx.Instance(u); err == nil && r.MigrationConsumer != "" {
			moved, r.MigrationConsumer = r.MigrationConsumer, ""
			if err := tx.PutInstance(&r); err != nil {
				return err
			}
		} else if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		return tx.DeleteIntent(it.ID)
	})
	return moved, err
}
