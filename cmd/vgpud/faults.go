package main

import (
	"context"

	"github.com/vgpud/vgpud/pkg/discover"
	"github.com/vgpud/vgpud/pkg/health"
	"github.com/vgpud/vgpud/pkg/uevent"
)

// The fault watcher's wiring: pkg/health follows uevents and NVML events
// and runs the periodic discovery; the daemon hands it the manager, the
// host's backends, the uevent source (the kernel's, or the simulated
// host's ring), the reloadable settings and a way to tell systemd the new
// state.

// startFaultWatch follows uevents and NVML events, and compares the host
// with the records every discoveryInterval, until ctx ends; stop waits
// for the operation in flight to finish.
// The periodic discovery waits for after (closed once the fleet is set
// up; nil: it starts at once).
func startFaultWatch(ctx context.Context, d *daemon, after <-chan struct{}) (stop func()) {
	return newFaultWatch(d, after).Start(ctx)
}

func newFaultWatch(d *daemon, after <-chan struct{}) *health.Watcher {
	cfg := health.Config{
		Manager: d.mgr,
		GPUs:    discover.Host{NVML: d.host.nvml, Sysfs: d.host.sysfs},
		Events:  d.host.nvml,
		// Read on every use: a reload's fault settings apply at once.
		Settings: func() health.Settings {
			l := d.cfg.Reloadable()
			return health.Settings{CriticalXIDs: l.CriticalXIDs, UeventSettle: l.UeventSettle, RecoverProbe: l.RecoverProbe,
				DiscoveryInterval: l.DiscoveryInterval}
		},
		// The periodic discovery logs as the daemon.
		Discovery: health.Discovery{Manager: d.mgr, Driver: d.host.nvml, Logger: d.log, After: after},
		Status:    func() { d.notify.Status(d.statusLine()) },
		Logger:    d.log.With("component", "faults"),
	}
	if h := d.host.sim; h != nil {
		cfg.OpenUevents = h.UeventSource
	} else {
		cfg.OpenUevents = func() (uevent.Source, error) { return uevent.OpenNetlink(uevent.NetlinkOptions{}) }
	}
	return health.New(cfg)
}
