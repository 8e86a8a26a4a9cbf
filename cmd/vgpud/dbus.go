package main

import (
	"context"
	"fmt"
	"os"

	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/share"
	"github.com/vgpud/vgpud/pkg/version"
)

// defaultSystemBus is where the system bus listens when
// $DBUS_SYSTEM_BUS_ADDRESS is unset.
const defaultSystemBus = "/run/dbus/system_bus_socket"

// startDBus exports the manager on the system bus (or cfg.BusAddress) as
// dev.vgpud1; stop releases the name. It fails when the name is taken
// (another vgpud) or the bus policy refuses it, and when a configured bus
// cannot be reached. Only the simulated host may run without any bus, so
// tests and demos that do not need the API run where no dbus-daemon is.
func startDBus(ctx context.Context, d *daemon) (stop func(), err error) {
	addr := d.cfg.BusAddress
	configured := addr != "" || os.Getenv("DBUS_SYSTEM_BUS_ADDRESS") != ""
	if !configured && d.cfg.Sim && !exists(defaultSystemBus) {
		d.log.Warn("no system bus: the D-Bus API is off (simulated host only; pass --bus-address to use a private bus)", "socket", defaultSystemBus)
		return func() {}, nil
	}
	svc, err := dbusapi.Start(ctx, d.mgr, dbusapi.Options{
		Address: addr,
		Logger:  d.log.With("component", "dbus"),
		Version: version.Version,
		Apply:   dbusapi.NewApplier(d.mgr, apply.Limits{MaxChanges: d.cfg.ApplyMaxChanges, Concurrency: d.cfg.GPUConcurrency}),
		Shares:  d.shares,
		Fleet:   fleetStatus{d.fleet},
		// groupAccess: read leaves the group's changes to polkit.
		GroupReadOnly: d.cfg.GroupAccess == "read",
	})
	if err != nil {
		return nil, fmt.Errorf("D-Bus API: %w", err)
	}
	// The stop cancels what is still in flight when its grace ends, so that
	// every caller has an answer before the daemon leaves the bus.
	d.bus = svc
	return func() {
		if err := svc.Close(); err != nil {
			d.log.Debug("close D-Bus connection", "err", err)
		}
	}, nil
}

// loopShares serves the share loop's latest window to D-Bus GetShares
// (vgpuctl top), in milli-GPU.
type loopShares struct{ loop *share.Loop }

func (l loopShares) Shares(context.Context) ([]dbusapi.Share, error) {
	var out []dbusapi.Share
	for _, s := range l.loop.Shares() {
		out = append(out, dbusapi.Share{Instance: s.Instance, EntitledMilli: uint64(s.Entitled*1000 + 0.5),
			AchievedMilli: s.Achieved * 1000, DemandMilli: s.Demand * 1000, Interference: s.Interference})
	}
	return out, nil
}
