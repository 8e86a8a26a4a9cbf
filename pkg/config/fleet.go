package config

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/placementapi"
	"github.com/vgpud/vgpud/pkg/profile"
)

// FleetConfig is the `fleet:` section of vgpud.yaml: OpenStack Placement
// (docs/fleet.md). Absent, or with no endpoint, the host is not published.
type FleetConfig struct {
	// Endpoint is Placement's URL, e.g. http://controller:8778.
	Endpoint string `json:"endpoint,omitempty"`
	// TokenFile holds a keystone token sent as X-Auth-Token ("": noauth2,
	// token "admin").
	TokenFile string `json:"tokenFile,omitempty"`
	// Host names the providers (default: the host name).
	Host string `json:"host,omitempty"`
	// RootUUID is the root provider's UUID (default: derived from Host,
	// stable across restarts); ParentUUID an existing provider (e.g.
	// nova-compute's) to publish the GPUs under instead.
	RootUUID   string `json:"rootUUID,omitempty"`
	ParentUUID string `json:"parentUUID,omitempty"`
	// SyncInterval is the periodic full pass (default 60s); changes are
	// published as they happen.
	SyncInterval Duration `json:"syncInterval,omitempty"`
	// AuditInterval is how often the allocations of a GPU's provider that
	// holds only this host's instances' are read again when nothing moved
	// its generation, to find one deleted by someone else (default 5m,
	// at least SyncInterval; one holding a scheduler's claim not yet
	// created is read every SyncInterval).
	AuditInterval Duration `json:"auditInterval,omitempty"`
	// Grace is how long an allocation without an instance may live on the
	// host's providers (default 2m).
	Grace Duration `json:"grace,omitempty"`
	// Timeout bounds each Placement request (default 5s), and twice it a
	// scheduler's create reading and completing its allocation;
	// ClaimTimeout a local create's claim (default 2s).
	Timeout      Duration `json:"timeout,omitempty"`
	ClaimTimeout Duration `json:"claimTimeout,omitempty"`
	// Inventories is how a MIG GPU's per-profile totals are published:
	// "carvable" (the default: every mix Placement accepts is carvable)
	// or "exact" (each profile's room now, counted alone).
	Inventories string `json:"inventories,omitempty"`
	// Offer names, per GPU model, the profiles published to Placement
	// (absent: every profile the host can carve); checked against the
	// catalog when the fleet settings are applied.
	Offer map[string][]string `json:"offer,omitempty"`
}

// validate checks the section before anything uses it, so a reload with a
// broken one is refused as a whole (nil: no fleet).
func (f *FleetConfig) validate() error {
	if f == nil || f.Endpoint == "" {
		return nil
	}
	if _, err := placementapi.New(placementapi.Config{Endpoint: f.Endpoint}); err != nil {
		return fmt.Errorf("fleet.endpoint: %w", err)
	}
	for key, v := range map[string]string{"fleet.rootUUID": f.RootUUID, "fleet.parentUUID": f.ParentUUID} {
		if _, err := uuid.Parse(v); v != "" && err != nil {
			return fmt.Errorf("%s: %q is not a UUID", key, v)
		}
	}
	if f.RootUUID != "" && f.ParentUUID != "" {
		return errors.New("fleet: rootUUID and parentUUID exclude each other (parentUUID publishes under nova-compute's provider)")
	}
	switch f.Inventories {
	case "", "exact", "carvable":
	default:
		return fmt.Errorf("fleet.inventories: %q is not exact or carvable", f.Inventories)
	}
	for model, ps := range f.Offer {
		if !profile.IsModelName(model) {
			return fmt.Errorf("fleet.offer: %q is not a GPU model name (e.g. H100-SXM5-80GB)", model)
		}
		if len(ps) == 0 {
			return fmt.Errorf("fleet.offer.%s: no profile listed (leave the model out to publish all of them)", model)
		}
		for _, p := range ps {
			if !profile.IsProfileName(p) && !profile.IsProfileName(strings.TrimPrefix(p, "NVIDIA ")) {
				return fmt.Errorf("fleet.offer.%s: %q is not a profile name (e.g. 3g.40gb, L4-4Q, passthrough)", model, p)
			}
		}
	}
	for key, d := range map[string]time.Duration{"fleet.syncInterval": f.SyncInterval.Duration, "fleet.auditInterval": f.AuditInterval.Duration, "fleet.grace": f.Grace.Duration,
		"fleet.timeout": f.Timeout.Duration, "fleet.claimTimeout": f.ClaimTimeout.Duration} {
		if d < 0 || d > 24*time.Hour {
			return fmt.Errorf("%s: %s must be 0 (the default) to 24h", key, d)
		}
	}
	return nil
}
