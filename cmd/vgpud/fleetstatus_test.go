package main

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/fleet"
)

// TestFleetStatusMirrored: every field of fleet's status reaches the API's
// types, so vgpuctl fleet status shows all the syncer knows.
func TestFleetStatusMirrored(t *testing.T) {
	for _, p := range []struct{ from, to any }{
		{fleet.Status{}, dbusapi.FleetStatus{}},
		{fleet.ProviderStatus{}, dbusapi.FleetProvider{}},
		{fleet.ClassStatus{}, dbusapi.FleetClass{}},
		{fleet.Difference{}, dbusapi.FleetDifference{}},
	} {
		ft, tt := reflect.TypeOf(p.from), reflect.TypeOf(p.to)
		for i := range ft.NumField() {
			if _, ok := tt.FieldByName(ft.Field(i).Name); !ok {
				t.Errorf("%s.%s has no counterpart in %s", ft, ft.Field(i).Name, tt)
			}
		}
	}
	now := time.Now()
	out := fleetStatusOut(fleet.Status{Host: "h", LastSync: now, Providers: []fleet.ProviderStatus{{Name: "h_pci_0000_41_00_0", Classes: []fleet.ClassStatus{{Class: "C", HostTotal: 3}}}},
		Differences: []fleet.Difference{{Kind: fleet.DiffAllocationStale, Subject: "c"}}})
	if out.LastSync == nil || !out.LastSync.Equal(now) || out.Providers[0].Classes[0].HostTotal != 3 || out.Differences[0].Kind != "allocation-stale" {
		t.Fatalf("fleetStatusOut = %+v", out)
	}
	if out := fleetStatusOut(fleet.Status{}); out.LastSync != nil || out.Providers == nil || out.Differences == nil {
		t.Fatalf("empty status = %+v (want no last sync, empty lists)", out)
	}
}

// TestFleetStatusWithoutFleet: a daemon without a fleet: section answers
// ErrNoFleet, which D-Bus names Unavailable with how to configure one.
func TestFleetStatusWithoutFleet(t *testing.T) {
	r := fleetStatus{fleet.NewRunner(fleet.RunnerConfig{})}
	if _, err := r.FleetStatus(context.Background()); !errors.Is(err, dbusapi.ErrNoFleet) {
		t.Fatalf("FleetStatus without a fleet = %v, want ErrNoFleet", err)
	}
}
