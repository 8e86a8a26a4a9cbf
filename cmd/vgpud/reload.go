package main

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"sort"
	"time"

	"github.com/vgpud/vgpud/pkg/profile"
)

// reloadableKeys are the settings reload applies to the running daemon.
var reloadableKeys = map[string]bool{"criticalXIDs": true, "ueventSettle": true, "recoverProbe": true, "discoveryInterval": true, "logLevel": true, "fleet": true, "metricsWebConfigFile": true}

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
	next := defaultConfig()
	next.flags = d.cfg.flags
	if err := next.load(nil); err != nil {
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
	var web *metricsWeb
	if d.metricsGate != nil {
		if web, err = loadMetricsWeb(next.MetricsWebConfigFile); err != nil {
			d.log.Error("reload refused: metrics web configuration invalid; keeping the running one", "err", err)
			return
		}
	}
	applied, restart := changedSettings(running(d.cfg), next)
	d.cfg.applyReloadable(next)
	if lvl, err := next.level(); err == nil && d.level != nil {
		d.level.Set(lvl)
	}
	if !reflect.DeepEqual(cat.Models(), d.catalog().Models()) {
		// New requests plan with the new catalog; records and the host stay.
		d.reloadedCat.Store(cat)
		d.host.nvml.SetCatalog(cat)
		d.mgr.SetCatalog(cat)
		applied = append(applied, "catalog")
	}
	if err := d.fleet.apply(ctx, d, next.Fleet); err != nil {
		// The running sync (or none) goes on with the settings in force.
		d.log.Error("reload: fleet settings refused; the running fleet settings are kept", "err", err)
	} else {
		d.cfg.Fleet = next.Fleet
	}
	d.cfg.MetricsWebConfigFile = next.MetricsWebConfigFile
	if web != nil {
		d.metricsGate.set(web)
		d.log.Info("metrics endpoint: web configuration applied", "file", web.file, "tls", web.tls != nil, "basicAuthUsers", len(web.users))
	}
	d.log.Info("configuration reloaded", "file", next.file, "applied", applied)
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

// changedSettings compares two configurations key by key (the file's
// keys), split into those reload applies and those needing a restart.
// Both are effective values (file and flags together), so a key is named
// only when what would be in force differs from what is.
func changedSettings(old, next *Config) (applied, restart []string) {
	a, b := settingsMap(old), settingsMap(next)
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	// The file format's version is not a setting: nothing changes with it.
	delete(keys, "version")
	for k := range keys {
		if reflect.DeepEqual(a[k], b[k]) {
			continue
		}
		if reloadableKeys[k] {
			applied = append(applied, k)
		} else {
			restart = append(restart, k)
		}
	}
	sort.Strings(applied)
	sort.Strings(restart)
	return applied, restart
}

// running is the configuration in force: what the daemon started with,
// with the reloadable settings a reload may since have changed.
func running(c *Config) *Config {
	cur := *c
	l := c.Reloadable()
	cur.CriticalXIDs = nil
	for x := range l.CriticalXIDs {
		cur.CriticalXIDs = append(cur.CriticalXIDs, uint(x))
	}
	cur.UeventSettle, cur.RecoverProbe = Duration{l.UeventSettle}, Duration{l.RecoverProbe}
	cur.DiscoveryInterval = Duration{l.DiscoveryInterval}
	cur.LogLevel = l.LogLevel
	return &cur
}

func settingsMap(c *Config) map[string]any {
	cp := *c
	cp.CriticalXIDs = slices.Clone(c.CriticalXIDs)
	slices.Sort(cp.CriticalXIDs)
	cp.CriticalXIDs = slices.Compact(cp.CriticalXIDs)
	data, err := json.Marshal(&cp)
	if err != nil {
		return nil
	}
	var m map[string]any
	_ = json.Unmarshal(data, &m)
	return m
}
