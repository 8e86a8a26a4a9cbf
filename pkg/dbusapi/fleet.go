package dbusapi

import (
	"context"
	"errors"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/vgpud/vgpud/pkg/manager"
)

// ErrNoFleet is what a FleetSource returns while no fleet is configured.
var ErrNoFleet = errors.New("no fleet")

// FleetSource is what GetFleetStatus needs from the Placement sync
// (pkg/fleet, adapted in cmd/vgpud).
type FleetSource interface {
	// FleetStatus compares Placement with the host now; ErrNoFleet when
	// no fleet is configured.
	FleetStatus(ctx context.Context) (FleetStatus, error)
}

// FleetStatus is what OpenStack Placement holds against what the host
// holds (docs/fleet.md).
type FleetStatus struct {
	Endpoint string `json:"endpoint"`
	Host     string `json:"host"`
	// Root is the provider the GPU providers hang under.
	Root string `json:"root"`
	// LastSync is the last successful sync pass; absent before the first.
	LastSync *time.Time `json:"lastSync,omitempty"`
	// LastError is the last pass's error; empty when it succeeded.
	LastError   string            `json:"lastError,omitempty"`
	Providers   []FleetProvider   `json:"providers"`
	Differences []FleetDifference `json:"differences"`
}

// FleetProvider is one GPU's resource provider.
type FleetProvider struct {
	UUID string `json:"uuid"`
	Name string `json:"name"`
	GPU  string `json:"gpu"`
	// InPlacement is false when Placement lacks the provider.
	InPlacement bool         `json:"inPlacement"`
	Classes     []FleetClass `json:"classes"`
	// HostAllocations counts the GPU's instances, PlacementAllocations
	// the consumers Placement holds on the provider.
	HostAllocations      int `json:"hostAllocations"`
	PlacementAllocations int `json:"placementAllocations"`
}

// FleetClass is one resource class on a provider: the inventory the host
// wants published and what Placement holds (zero where it has none).
type FleetClass struct {
	Class             string `json:"class"`
	HostTotal         int    `json:"hostTotal"`
	HostReserved      int    `json:"hostReserved"`
	HostMaxUnit       int    `json:"hostMaxUnit"`
	PlacementTotal    int    `json:"placementTotal"`
	PlacementReserved int    `json:"placementReserved"`
	PlacementUsed     int    `json:"placementUsed"`
}

// FleetDifference is one way Placement differs from the host. Kind is
// provider-missing, provider-stale, inventory-missing, inventory-stale,
// inventory-differs, traits-differ, allocation-missing, allocation-stale,
// allocation-differs or write-failed (a write the last pass could not make:
// Subject the consumer, "inventories", "traits" or the provider UUID, Host
// the write, Placement the error); Subject the class, consumer or provider UUID.
type FleetDifference struct {
	Kind      string `json:"kind"`
	Provider  string `json:"provider"`
	Subject   string `json:"subject"`
	Host      string `json:"host"`
	Placement string `json:"placement"`
}

// fleetProviderEntry is one GetFleetStatus provider: (uuid, name, gpu,
// in placement, host allocations, placement allocations, classes).
type fleetProviderEntry struct {
	UUID, Name, GPU                       string
	InPlacement                           bool
	HostAllocations, PlacementAllocations uint32
	Classes                               []fleetClassEntry
}

// fleetClassEntry is (class, host total, host reserved, host max_unit,
// placement total, placement reserved, placement used).
type fleetClassEntry struct {
	Class                                            string
	HostTotal, HostReserved, HostMaxUnit             int32
	PlacementTotal, PlacementReserved, PlacementUsed int32
}

// fleetDiffEntry is (kind, provider, subject, host, placement).
type fleetDiffEntry struct {
	Kind, Provider, Subject, Host, Placement string
}

func (s *Service) getFleetStatus(c *call) (string, string, string, int64, string, []fleetProviderEntry, []fleetDiffEntry, error) {
	none := func(err error) (string, string, string, int64, string, []fleetProviderEntry, []fleetDiffEntry, error) {
		return "", "", "", 0, "", nil, nil, err
	}
	if s.opts.Fleet == nil {
		return none(unavailable("no fleet: configure fleet: in vgpud.yaml (docs/fleet.md)"))
	}
	st, err := s.opts.Fleet.FleetStatus(c.ctx)
	switch {
	case errors.Is(err, ErrNoFleet):
		return none(unavailable("no fleet: configure fleet: in vgpud.yaml (docs/fleet.md)"))
	case err != nil && manager.Name(err) != NameBackendFailure:
		return none(err)
	case err != nil:
		s.log.Warn("fleet status", "err", err)
		return none(unavailable("fleet status: Placement at " + st.Endpoint + " could not be read (" + err.Error() + "); the sync retries, ask again when it answers"))
	}
	providers := []fleetProviderEntry{}
	for _, p := range st.Providers {
		e := fleetProviderEntry{UUID: p.UUID, Name: p.Name, GPU: p.GPU, InPlacement: p.InPlacement,
			HostAllocations: uint32(p.HostAllocations), PlacementAllocations: uint32(p.PlacementAllocations), Classes: []fleetClassEntry{}}
		for _, k := range p.Classes {
			e.Classes = append(e.Classes, fleetClassEntry{Class: k.Class, HostTotal: int32(k.HostTotal), HostReserved: int32(k.HostReserved), HostMaxUnit: int32(k.HostMaxUnit),
				PlacementTotal: int32(k.PlacementTotal), PlacementReserved: int32(k.PlacementReserved), PlacementUsed: int32(k.PlacementUsed)})
		}
		providers = append(providers, e)
	}
	diffs := []fleetDiffEntry{}
	for _, d := range st.Differences {
		diffs = append(diffs, fleetDiffEntry(d))
	}
	var last int64
	if st.LastSync != nil {
		last = st.LastSync.UnixMilli()
	}
	return st.Endpoint, st.Host, st.Root, last, st.LastError, providers, diffs, nil
}

// unavailable is the Unavailable error the daemon sends for a part of it
// that is not there (no fleet configured, Placement not answering).
func unavailable(msg string) *dbus.Error {
	return &dbus.Error{Name: ErrorPrefix + NameUnavailable, Body: []any{msg}}
}

// FleetStatus reads what Placement holds against what the host holds.
func (c *Client) FleetStatus(ctx context.Context) (FleetStatus, error) {
	var st FleetStatus
	var last int64
	var providers []fleetProviderEntry
	var diffs []fleetDiffEntry
	if err := c.call(ctx, "fleet status", "GetFleetStatus", nil, &st.Endpoint, &st.Host, &st.Root, &last, &st.LastError, &providers, &diffs); err != nil {
		return FleetStatus{}, err
	}
	if last > 0 {
		t := time.UnixMilli(last).UTC()
		st.LastSync = &t
	}
	st.Providers, st.Differences = []FleetProvider{}, []FleetDifference{}
	for _, p := range providers {
		fp := FleetProvider{UUID: p.UUID, Name: p.Name, GPU: p.GPU, InPlacement: p.InPlacement,
			HostAllocations: int(p.HostAllocations), PlacementAllocations: int(p.PlacementAllocations), Classes: []FleetClass{}}
		for _, k := range p.Classes {
			fp.Classes = append(fp.Classes, FleetClass{Class: k.Class, HostTotal: int(k.HostTotal), HostReserved: int(k.HostReserved), HostMaxUnit: int(k.HostMaxUnit),
				PlacementTotal: int(k.PlacementTotal), PlacementReserved: int(k.PlacementReserved), PlacementUsed: int(k.PlacementUsed)})
		}
		st.Providers = append(st.Providers, fp)
	}
	for _, d := range diffs {
		st.Differences = append(st.Differences, FleetDifference(d))
	}
	return st, nil
}
