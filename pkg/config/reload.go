package config

import (
	"encoding/json"
	"reflect"
	"slices"
	"sort"
)

// reloadableKeys are the settings reload applies to the running daemon.
var reloadableKeys = map[string]bool{"criticalXIDs": true, "ueventSettle": true, "recoverProbe": true, "discoveryInterval": true, "logLevel": true, "fleet": true, "metricsWebConfigFile": true}

// Changed compares two configurations key by key (the file's
// keys), split into those reload applies and those needing a restart.
// Both are effective values (file and flags together), so a key is named
// only when what would be in force differs from what is.
func Changed(old, next *Config) (applied, restart []string) {
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

// Running is the configuration in force: what the daemon started with,
// with the reloadable settings a reload may since have changed.
func (c *Config) Running() *Config {
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
