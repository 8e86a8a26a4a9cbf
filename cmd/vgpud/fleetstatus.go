package main

import (
	"context"

	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/fleet"
)

// FleetStatus serves D-Bus GetFleetStatus from the running syncer; with
// none (no fleet: section, or one without an endpoint) it is
// dbusapi.ErrNoFleet.
func (r *fleetRunner) FleetStatus(ctx context.Context) (dbusapi.FleetStatus, error) {
	r.mu.Lock()
	s := r.syncer
	r.mu.Unlock()
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
