package main

import (
	"context"
	"fmt"
	"os"

	"github.com/vgpud/vgpud/pkg/dbusapi"
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
		Apply:   dbusapi.NewApplier(d.mgr),
	})
	if err != nil {
		return nil, fmt.Errorf("D-Bus API: %w", err)
	}
	return func() {
		if err := svc.Close(); err != nil {
			d.log.Debug("close D-Bus connection", "err", err)
		}
	}, nil
}
