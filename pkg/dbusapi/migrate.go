package dbusapi

import (
	"bytes"
	"context"
	"encoding/json"

	"github.com/godbus/dbus/v5"

	"github.com/vgpud/vgpud/pkg/manager"
)

// The methods that move a VM with its vGPU between two vgpud hosts
// (docs/operations.md, "Moving VMs"): the source's MigrationSource,
// CompleteOutgoing and CancelOutgoing, the destination's PrepareIncoming,
// CommitIncoming and AbortIncoming. The metadata travel from the one to
// the other as the JSON document MigrationSource answers.

// maxMigration bounds the migration metadata PrepareIncoming takes: the
// driver's vGPU metadata are a few KiB.
const maxMigration = 256 << 10

func (s *Service) migrationSource(c *call, id string, options map[string]dbus.Variant) (string, error) {
	ctx, end, err := c.begin(newOpts(c.member, options))
	if err != nil {
		return "", err
	}
	defer end()
	ctx, outcome := manager.WithPlacementOutcome(ctx)
	md, err := s.m.MigrationSource(ctx, id)
	s.sync()
	if err != nil {
		return "", cancelled(ctx, err)
	}
	s.placementBehind(c, "migrate", md.Instance, outcome)
	doc, _ := json.Marshal(md) // strings, numbers and bytes: cannot fail
	return string(doc), nil
}

func (s *Service) prepareIncoming(c *call, metadata, vm, tenantName string, options map[string]dbus.Variant) (dbus.ObjectPath, string, string, uint32, uint32, error) {
	var md manager.MigrationMetadata
	dec := json.NewDecoder(bytes.NewReader([]byte(metadata)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&md); err != nil {
		return "", "", "", 0, 0, invalidArg("PrepareIncoming: the metadata are not MigrationSource's: %v", err)
	}
	if dec.More() {
		// One document: anything after it is not MigrationSource's either.
		return "", "", "", 0, 0, invalidArg("PrepareIncoming: the metadata are not MigrationSource's: more follows the JSON document")
	}
	ctx, end, err := c.begin(newOpts(c.member, options))
	if err != nil {
		return "", "", "", 0, 0, err
	}
	defer end()
	ctx, outcome := manager.WithPlacementOutcome(ctx)
	in, err := s.m.PrepareIncoming(ctx, md, vm, tenantName)
	s.sync()
	if err != nil {
		return "", "", "", 0, 0, cancelled(ctx, err)
	}
	s.placementBehind(c, "migrate", in.Instance.UUID, outcome)
	return InstancePath(in.Instance.UUID), in.Instance.UUID, in.Device, uint32(in.Compatibility.VM), uint32(in.Compatibility.Limit), nil
}

func (s *Service) commitIncoming(c *call, id string, options map[string]dbus.Variant) (string, bool, error) {
	ctx, end, err := c.begin(newOpts(c.member, options))
	if err != nil {
		return "", false, err
	}
	defer end()
	a, err := s.m.CommitIncoming(ctx, id)
	s.sync()
	if err != nil {
		return "", false, cancelled(ctx, err)
	}
	return a.DomainUUID, a.Live, nil
}

// migrationEnd runs one of the calls that end a migration's half.
func (s *Service) migrationEnd(c *call, id string, options map[string]dbus.Variant, fn func(*manager.Manager) func(ctx context.Context, id string) error) error {
	ctx, end, err := c.begin(newOpts(c.member, options))
	if err != nil {
		return err
	}
	defer end()
	ctx, outcome := manager.WithPlacementOutcome(ctx)
	err = fn(s.m)(ctx, id)
	s.sync()
	if err != nil {
		return cancelled(ctx, err)
	}
	s.placementBehind(c, "migrate", id, outcome)
	return nil
}

func (s *Service) abortIncoming(c *call, id string, options map[string]dbus.Variant) error {
	return s.migrationEnd(c, id, options, func(m *manager.Manager) func(context.Context, string) error { return m.AbortIncoming })
}

func (s *Service) completeOutgoing(c *call, id string, options map[string]dbus.Variant) error {
	return s.migrationEnd(c, id, options, func(m *manager.Manager) func(context.Context, string) error { return m.CompleteOutgoing })
}

func (s *Service) cancelOutgoing(c *call, id string, options map[string]dbus.Variant) error {
	return s.migrationEnd(c, id, options, func(m *manager.Manager) func(context.Context, string) error { return m.CancelOutgoing })
}
