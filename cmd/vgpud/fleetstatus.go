package main

import (
	"context"

	"github.com/vgpud/vgpud/pkg/config"
	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/fleet"
)

// fleetSettings are the fleet: section's settings for pkg/fleet's runner;
// nil (no section, or one without an endpoint) publishes nothing.
func fleetSettings(f *config.FleetConfig) *fleet.Settings {
	if f == nil || f.Endpoint == "" {
		return nil
	}
	return &fleet.Settings{Endpoint: f.Endpoint, TokenFile: f.TokenFile, Host: f.Host, RootUUID: f.RootUUID, ParentUUID: f.ParentUUID,
		SyncInterval: f.SyncInterval.Duration, AuditInterval: f.AuditInterval.Duration, Grace: f.Grace.Duration, Timeout: f.Timeout.Duration, ClaimTimeout: f.ClaimTimeout.Duration,
		Inventories: f.Inventories, Offer: f.Offer}
}

// fleetStatus serves D-Bus GetFleetStatus from the runner's syncer.
type fleetStatus struct{ r *fleet.Runner }

// FleetStatus is the running syncer's status; with none (no fleet:
// section, or one without an endpoint) it is dbusapi.ErrNoFleet.
func (f fleetStatus) FleetStatus(ctx context.Context) (dbusapi.FleetStatus, error) {
	s := f.r.Syncer()
	if s == nil {
		return dbusapi.FleetStatus{}, dbusapi.ErrNoFleet
	}
	st, err := s.Status(ctx)
	return fleetStatusOut(st), err
}

// fleetStatusOut is fleet.Status in the API's types.
func fleetStatusOut(st fleet.Status) dbusapi.FleetStatus {
	out := dbusapi.FleetStatus{Endpoint: st.Endpoint, Host: st.Host, Root: st.Root, LastError: st.LastError,
		Providers: []dbusapi.FleetProvider{}, Differences: []dbusapi.FleetDifference{}}
	if !st.LastSync.IsZero() {
		t := st.LastSync
		out.LastSync = &t
	}
	for _, p := range st.Providers {
		fp := dbusapi.FleetProvider{UUID: p.UUID, Name: p.Name, GPU: p.GPU, InPlacement: p.InPlacement,
			HostAllocations: p.HostAllocations, PlacementAllocations: p.PlacementAllocations, Classes: []dbusapi.FleetClass{}}
		for _, c := range p.Classes {
			fp.Classes = append(fp.Classes, dbusapi.FleetClass(c))
		}
		out.Providers = append(out.Providers, fp)
	}
	for _, d := range st.Differences {
		out.Differences = append(out.Differences, dbusapi.FleetDifference(d))
	}
	return out
}
