package main

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"sort"
	"time"
)

// liveKeys are the settings reload applies to the running daemon.
var liveKeys = map[string]bool{"criticalXIDs": true, "ueventSettle": true, "recoverProbe": true, "logLevel": true}

// reload re-reads the configuration file and the catalog on SIGHUP. State
// is not touched: instance records, the host and operations in flight stay
// as they are. A file or catalog that does not validate is refused and the
// running configuration kept. The fault settings apply at once (see Live);
// any other setting that changed is named as taking effect at the next
// start, and so is a changed catalog. Then the host is re-read, which is
// what an operator sending SIGHUP usually wants as well.
func (d *daemon) reload() {
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
	applied, restart := changedSettings(running(d.cfg), next)
	d.cfg.applyLive(next)
	if lvl, err := next.level(); err == nil && d.level != nil {
		d.level.Set(lvl)
	}
	if !reflect.DeepEqual(cat.Models(), d.host.cat.Models()) {
		// New requests plan with the new catalog; records and the host stay.
		d.host.cat = cat
		d.host.nvml.SetCatalog(cat)
		d.mgr.SetCatalog(cat)
		applied = append(applied, "catalog")
	}
	d.log.Info("configuration reloaded", "file", next.file, "applied", applied)
	if len(restart) > 0 {
		d.log.Warn("changed settings take effect at the next start", "settings", restart)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if d.mgr.Degraded() == "" {
		if err := d.mgr.Refresh(ctx); err != nil {
			d.log.Warn("re-read the host after reload", "err", err)
		}
	}
}

// changedSettings compares two configurations key by key (the file's
// keys), split into those reload applies and those needing a restart.
func changedSettings(old, next *Config) (applied, restart []string) {
	a, b := settingsMap(old), settingsMap(next)
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	for k := range keys {
		if reflect.DeepEqual(a[k], b[k]) {
			continue
		}
		if liveKeys[k] {
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
// with the live settings a reload may since have changed.
func running(c *Config) *Config {
	cur := *c
	l := c.Live()
	cur.CriticalXIDs = nil
	for x := range l.CriticalXIDs {
		cur.CriticalXIDs = append(cur.CriticalXIDs, uint(x))
	}
	cur.UeventSettle, cur.RecoverProbe = Duration{l.UeventSettle}, Duration{l.RecoverProbe}
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
