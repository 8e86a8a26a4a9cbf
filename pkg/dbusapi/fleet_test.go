package dbusapi

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/manager"
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

// fakeFleet is a FleetSource; the service calls it from its own
// goroutines (the bus round trip is no happens-before the race detector
// sees), hence the lock.
type fakeFleet struct {
	mu  sync.Mutex
	st  FleetStatus
	err error
}

func (f *fakeFleet) FleetStatus(ctx context.Context) (FleetStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st, f.err
}

func (f *fakeFleet) fail(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

// TestFleetStatus: GetFleetStatus carries every field of the status and
// names why it cannot answer: no fleet configured, Placement down.
func TestFleetStatus(t *testing.T) {
	last := time.UnixMilli(1_780_000_000_123).UTC()
	want := FleetStatus{Endpoint: "http://127.0.0.1:8778", Host: "hosta", Root: "7b1d3c0e-5a1f-5f4e-9d1a-2b6c0f9e8a11", LastSync: &last, LastError: "x",
		Providers: []FleetProvider{{UUID: "u1", Name: "hosta_pci_0000_41_00_0", GPU: "0000:41:00.0", InPlacement: true, HostAllocations: 2, PlacementAllocations: 3,
			Classes: []FleetClass{{Class: "CUSTOM_VGPUD_MIG_SLICE", HostTotal: 8, HostReserved: 1, HostMaxUnit: 8, PlacementTotal: 8, PlacementReserved: 2, PlacementUsed: 5}}}},
		Differences: []FleetDifference{{Kind: "allocation-stale", Provider: "hosta_pci_0000_41_00_0", Subject: "c1", Host: "no instance", Placement: "CUSTOM_VGPUD_MIG_SLICE=1"}}}
	f := &fakeFleet{st: want}
	e := newEnv(t, testbus.Options{}, func(_ *env, o *Options) { o.Fleet = f })
	got, err := e.client.FleetStatus(ctxT(t))
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("FleetStatus = %+v, %v\nwant %+v", got, err, want)
	}
	for _, c := range []struct {
		err  error
		name string
	}{
		{ErrNoFleet, NameUnavailable},
		{errors.New("placement unreachable: dial tcp: refused"), NameUnavailable},
		{fmt.Errorf("read the host: %w", manager.ErrGPULost), NameGPULost},
	} {
		f.fail(c.err)
		if _, err := e.client.FleetStatus(ctxT(t)); ErrorName(err) != c.name {
			t.Errorf("source error %v: FleetStatus = %v, want %s", c.err, err, c.name)
		}
	}
	// A service started without a fleet at all says how to configure one.
	e2 := newEnv(t, testbus.Options{}, nil)
	_, err = e2.client.FleetStatus(ctxT(t))
	var de *Error
	if !errors.As(err, &de) || de.Name != NameUnavailable || de.Message != "no fleet: configure fleet: in vgpud.yaml (docs/fleet.md)" {
		t.Fatalf("FleetStatus without a fleet = %v", err)
	}
}
