package main

import (
	"context"
	"reflect"
	"time"

	"github.com/vgpud/vgpud/pkg/config"
	"github.com/vgpud/vgpud/pkg/metricsweb"
	"github.com/vgpud/vgpud/pkg/profile"
)

// reloadTimeout bounds the host re-read that ends a reload.
const reloadTimeout = 30 * time.Second

// reload re-reads the configuration file and the catalog on SIGHUP. State
// is not touched: instance records, the host and operations in flight stay
// as they are. A file or catalog that does not validate is refused and the
// running configuration kept. The fault settings and the log level apply
// at once (see Reloadable); a changed catalog is used by new requests; any other
// setting that changed is named as taking effect at the next start. Then
// the host is re-read, which is what an operator sending SIGHUP usually
// wants as well. It runs beside the main loop (serve.go), which keeps the
// watchdog fed meanwhile; ctx ends it early when the daemon stops.
func (d *daemon) reload(ctx context.Context) {
	d.notify.Reloading()
	defer func() { d.notify.Ready(d.statusLine()) }()
	next, err := d.cfg.Reload()
	if err != nil {
		d.log.Error("reload refused: configuration invalid; keeping the running one", "err", err)
		return
	}
	cat, err := loadCatalog(next)
	if err != nil {
		d.log.Error("reload refused: catalog invalid; keeping the running one", "err", err)
		return
	}
	// The metrics endpoint's web configuration is re-read whether or not
	// its path changed (certificates and users change inside the file).
	var web *metricsweb.Web
	if d.metricsGate != nil {
		if web, err = metricsweb.Load(next.MetricsWebConfigFile); err != nil {
			d.log.Error("reload refused: metrics web configuration invalid; keeping the running one", "err", err)
			return
		}
	}
	applied, restart := config.Changed(d.cfg.Running(), next)
	d.cfg.ApplyReloadable(next)
	if lvl, err := next.Level(); err == nil && d.level != nil {
		d.level.Set(lvl)
	}
	if !reflect.DeepEqual(cat.Models(), d.catalog().Models()) {
		// New requests plan with the new catalog; records and the host stay.
		d.reloadedCat.Store(cat)
		d.host.nvml.SetCatalog(cat)
		d.mgr.SetCatalog(cat)
		applied = append(applied, "catalog")
	}
	if err := d.fleet.Apply(ctx, fleetSettings(next.Fleet)); err != nil {
		// The running sync (or none) goes on with the settings in force.
		d.log.Error("reload: fleet settings refused; the running fleet settings are kept", "err", err)
	} else {
		d.cfg.Fleet = next.Fleet
	}
	d.cfg.MetricsWebConfigFile = next.MetricsWebConfigFile
	if web != nil {
		d.metricsGate.Set(web)
		d.log.Info("metrics endpoint: web configuration applied", "file", web.File(), "tls", web.TLS(), "basicAuthUsers", web.Users())
	}
	d.log.Info("configuration reloaded", "file", next.File(), "applied", applied)
	if len(restart) > 0 {
		d.log.Warn("changed settings take effect at the next start", "settings", restart)
	}
	ctx, cancel := context.WithTimeout(ctx, reloadTimeout)
	defer cancel()
	if d.mgr.Degraded() == "" {
		if err := d.mgr.Refresh(ctx); err != nil {
			d.log.Warn("re-read the host after reload", "err", err)
		}
	}
}

// catalog is the catalog in force: the one the daemon started with, or
// the one the last reload applied. Safe for concurrent use (the share
// loop and the metrics read it while a reload may replace it).
func (d *daemon) catalog() *profile.Catalog {
	if c := d.reloadedCat.Load(); c != nil {
		return c
	}
	return d.host.cat
}
