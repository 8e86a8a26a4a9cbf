package dbusapi

import (
	"reflect"
	"testing"

	"github.com/vgpud/vgpud/pkg/manager"
)

// TestMirroredTypesComplete: the client's types mirror the manager's at
// the D-Bus boundary; a field the manager adds must reach the client too
// (or be listed here with why not), so nothing is dropped on the way.
func TestMirroredTypesComplete(t *testing.T) {
	pairs := []struct {
		manager, client any
		// renamed maps a manager field to its client name; "" means the
		// field does not cross, with the reason in a comment.
		renamed map[string]string
	}{
		{manager.ReconcileReport{}, ReconcileReport{}, map[string]string{"Duration": "DurationSeconds"}},
		// Origin does not cross: Reconcile's a(ssss) foreign entries are
		// dev.vgpud1 API, and the manager writes the origin into Detail too.
		{manager.Foreign{}, Foreign{}, map[string]string{"Origin": ""}},
		{manager.Capacity{}, Capacity{}, nil},
	}
	for _, p := range pairs {
		mt, ct := reflect.TypeOf(p.manager), reflect.TypeOf(p.client)
		for i := range mt.NumField() {
			f := mt.Field(i)
			name, ok := p.renamed[f.Name]
			if !ok {
				name = f.Name
			}
			if name == "" {
				continue
			}
			if _, ok := ct.FieldByName(name); !ok {
				t.Errorf("%s.%s has no counterpart %s.%s: carry it through D-Bus", mt, f.Name, ct, name)
			}
		}
	}
}
