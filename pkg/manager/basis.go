package manager

import (
	"maps"
	"reflect"

	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
)

// basis is an admission's decision and what it was made from: the
// tenant's record, the snapshot (records, attachments, inventory, failed
// and switching GPUs) and the catalog. A create that claims in the fleet
// decides before the admission lock, to know which GPU to claim; the
// admission under the lock takes that decision again when its basis still
// holds, so that a create decides once, and decides anew (on the claimed
// GPU) when anything changed meanwhile.
type basis struct {
	tenant store.Tenant
	s      *snapshot
	cat    *profile.Catalog
	d      decision
}

// holds reports whether b was decided from exactly what now shows (a nil
// b holds nothing).
func (b *basis) holds(now *basis) bool {
	return b != nil && b.cat == now.cat && reflect.DeepEqual(b.tenant, now.tenant) &&
		reflect.DeepEqual(b.s.inv, now.s.inv) && reflect.DeepEqual(b.s.recs, now.s.recs) &&
		reflect.DeepEqual(b.s.atts, now.s.atts) && maps.Equal(b.s.failed, now.s.failed) &&
		maps.Equal(b.s.switching, now.s.switching)
}

// decided is the decision a create's claim was written for (nil: none).
func (op *fleetOp) decided() *basis {
	if op == nil {
		return nil
	}
	return op.basis
}
