package main

import "context"

// startDBus exports the manager on the system bus (or cfg.BusAddress) as
// dev.vgpud1; stop releases the name.
func startDBus(ctx context.Context, d *daemon) (stop func(), err error) {
	d.log.Warn("D-Bus API not built into this version")
	return func() {}, nil
}
