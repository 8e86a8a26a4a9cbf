package dbusapi

import (
	"testing"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
)

// TestCreatePlacementConsumer: the option reaches the manager. A host
// without Placement refuses a create that names a consumer (the fleet's
// side is tested in pkg/fleet against a real Placement); a blank or
// non-UUID consumer is InvalidArgument before anything is asked.
func TestCreatePlacementConsumer(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	e.tenant("acme", unlimitedQuota())
	for _, consumer := range []string{"9a0e0c3c-0d6f-4a11-8b2e-6f1c2b9e51d2", "not-a-uuid", " "} {
		_, err := e.client.Create(ctxT(t), CreateRequest{Tenant: "acme", Profile: "1g.10gb", PlacementConsumer: consumer})
		if ErrorName(err) != NameInvalidArgument {
			t.Fatalf("Create with placement-consumer %q = %v, want InvalidArgument", consumer, err)
		}
	}
	if list, err := e.client.Instances(ctxT(t), "acme"); err != nil || len(list) != 0 {
		t.Fatalf("refused creates left %v, %v", list, err)
	}
}
