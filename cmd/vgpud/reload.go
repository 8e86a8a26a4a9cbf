package main

// reload re-reads the configuration file and catalog on SIGHUP. Settings
// that need a restart are reported, not applied; state is kept.
func (d *daemon) reload() {
	next := defaultConfig()
	next.flags = d.cfg.flags
	if err := next.load(nil); err != nil {
		d.log.Error("reload refused: configuration invalid; keeping the running one", "err", err)
		return
	}
	if _, err := loadCatalog(next); err != nil {
		d.log.Error("reload refused: catalog invalid; keeping the running one", "err", err)
		return
	}
	if next.StateDir != d.cfg.StateDir || next.Sim != d.cfg.Sim || next.MetricsListen != d.cfg.MetricsListen {
		d.log.Warn("stateDir, sim and metricsListen change only at restart")
	}
	d.log.Info("configuration reloaded")
}
