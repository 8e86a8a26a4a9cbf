package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/manager"
)

// loadWith loads a configuration from file content and flags, as main does.
func loadWith(t *testing.T, yaml string, args ...string) (*Config, error) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "vgpud.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Default()
	fs := pflag.NewFlagSet("vgpud", pflag.ContinueOnError)
	cfg.BindFlags(fs)
	if err := fs.Parse(append([]string{"--config", file}, args...)); err != nil {
		return nil, err
	}
	return cfg, cfg.Load(fs)
}

func TestConfigFileAndFlags(t *testing.T) {
	tests := []struct {
		name  string
		yaml  string
		args  []string
		check func(c *Config) string
	}{
		{name: "defaults", yaml: "", check: func(c *Config) string {
			if c.StateDir != "/var/lib/vgpud" || c.DriverWait.Duration != 2*time.Minute || c.MetricsListen != "127.0.0.1:9835" {
				return "defaults changed"
			}
			return ""
		}},
		{name: "file-sets", yaml: "version: v1\nstateDir: /srv/vgpud\ndriverWait: 30s\ncriticalXIDs: [79, 48]\n", check: func(c *Config) string {
			if c.StateDir != "/srv/vgpud" || c.DriverWait.Duration != 30*time.Second || !reflect.DeepEqual(c.CriticalXIDs, []uint{79, 48}) {
				return "file values not applied"
			}
			return ""
		}},
		{name: "flag-overrides-file", yaml: "stateDir: /srv/vgpud\ndriverWait: 30s\n", args: []string{"--state-dir", "/tmp/x", "--critical-xids", "95"},
			check: func(c *Config) string {
				if c.StateDir != "/tmp/x" || c.DriverWait.Duration != 30*time.Second || !reflect.DeepEqual(c.CriticalXIDs, []uint{95}) {
					return "flags must win over the file, unset flags must not"
				}
				return ""
			}},
		{name: "flag-to-empty", yaml: "metricsListen: 0.0.0.0:9835\n", args: []string{"--metrics-listen", ""}, check: func(c *Config) string {
			if c.MetricsListen != "" {
				return "an explicitly empty flag must override"
			}
			return ""
		}},
		{name: "relative-state-dir-made-absolute", yaml: "stateDir: state\n", check: func(c *Config) string {
			if !filepath.IsAbs(c.StateDir) {
				return "stateDir not absolute"
			}
			return ""
		}},
		{name: "libvirt-socket-auto-by-default", check: func(c *Config) string {
			if c.LibvirtSocket != "auto" {
				return "libvirtSocket must default to auto"
			}
			return ""
		}},
		{name: "libvirt-socket-path", yaml: "libvirtSocket: /run/libvirt/virtqemud-sock\n", check: func(c *Config) string {
			if c.LibvirtSocket != "/run/libvirt/virtqemud-sock" {
				return "libvirtSocket path not taken"
			}
			return ""
		}},
		{name: "discovery-interval", yaml: "discoveryInterval: 20s\n", check: func(c *Config) string {
			if c.Reloadable().DiscoveryInterval != 20*time.Second {
				return "discoveryInterval not taken from the file"
			}
			return ""
		}},
		{name: "gpu-concurrency", yaml: "gpuConcurrency: 1\n", check: func(c *Config) string {
			if c.GPUConcurrency != 1 {
				return "gpuConcurrency not taken from the file"
			}
			return ""
		}},
		{name: "reloadable-settings", yaml: "ueventSettle: 2s\nrecoverProbe: 1s\ncriticalXIDs: [94]\n", check: func(c *Config) string {
			l := c.Reloadable()
			if l.UeventSettle != 2*time.Second || l.RecoverProbe != time.Second || !l.CriticalXIDs[94] || l.CriticalXIDs[79] {
				return "reloadable settings not taken from the file"
			}
			return ""
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := loadWith(t, tt.yaml, tt.args...)
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			if why := tt.check(c); why != "" {
				t.Fatalf("%s: %+v", why, c)
			}
		})
	}
}

// TestConfigErrors: every mistake is refused at start with the key named,
// as a usage error (exit status 2).
func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name, yaml string
		args       []string
		want       string
	}{
		{name: "unknown-key", yaml: "stateDri: /x\n", want: `unknown field "stateDri"`},
		{name: "bad-version", yaml: "version: v2\n", want: `version: "v2" is not supported`},
		{name: "bad-duration", yaml: "driverWait: 5\n", want: `duration "5"`},
		{name: "wrong-type", yaml: "sim: maybe\n", want: "sim"},
		{name: "driver-wait-range", yaml: "driverWait: 2h\n", want: "driverWait: 2h0m0s must be 0..1h"},
		{name: "relative-sysfs-root", yaml: "sysfsRoot: sys\n", want: `sysfsRoot: "sys" must be an absolute path`},
		{name: "relative-socket", yaml: "libvirtSocket: libvirt-sock\n", want: `libvirtSocket: "libvirt-sock" must be "auto", an absolute path, or empty`},
		{name: "discovery-interval-short", yaml: "discoveryInterval: 500ms\n", want: "discoveryInterval: 500ms must be 1s..1h"},
		{name: "discovery-interval-long", args: []string{"--discovery-interval", "2h"}, want: "discoveryInterval: 2h0m0s must be 1s..1h"},
		{name: "libvirt-uri", yaml: "libvirtURI: system\n", want: `libvirtURI: "system" is not a libvirt URI`},
		{name: "bus-address", yaml: "busAddress: /run/dbus/system_bus_socket\n", want: "busAddress"},
		{name: "metrics-listen", yaml: "metricsListen: 9835\n", want: "metricsListen"},
		{name: "log-level", yaml: "logLevel: loud\n", want: "logLevel"},
		{name: "undefine-policy", yaml: "undefinePolicy: delete\n", want: "undefinePolicy"},
		{name: "group-access", yaml: "groupAccess: change\n", want: `groupAccess: "change" must be manage or read`},
		{name: "xid-zero", yaml: "criticalXIDs: [0]\n", want: "criticalXIDs: 0 is not an XID"},
		{name: "uevent-settle", yaml: "ueventSettle: 1ms\n", want: "ueventSettle: 1ms must be 10ms..1m"},
		{name: "recover-probe", yaml: "recoverProbe: 1h\n", want: "recoverProbe"},
		{name: "gpu-concurrency", yaml: "gpuConcurrency: 0\n", want: "gpuConcurrency: 0 must be 1..64"},
		{name: "gpu-concurrency-high", yaml: "gpuConcurrency: 65\n", want: "gpuConcurrency: 65 must be 1..64"},
		{name: "sim-host-without-sim", yaml: "simHost: /etc/vgpud/host.yaml\n", want: "simHost: only with sim"},
		{name: "flag-checked-too", args: []string{"--collect-interval", "1ms"}, want: "collectInterval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadWith(t, tt.yaml, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("load: %v, want an error containing %q", err, tt.want)
			}
			if !strings.Contains(err.Error(), "configuration") {
				t.Fatalf("error %q does not say it is the configuration", err)
			}
			t.Logf("%v", err)
		})
	}
	t.Run("validation-is-a-usage-error", func(t *testing.T) {
		_, err := loadWith(t, "logLevel: loud\n")
		var inv *InvalidError
		if !errors.As(err, &inv) {
			t.Fatalf("%v: want an *InvalidError (the command line's exit status 2)", err)
		}
	})
	t.Run("missing-explicit-file", func(t *testing.T) {
		cfg := Default()
		fs := pflag.NewFlagSet("vgpud", pflag.ContinueOnError)
		cfg.BindFlags(fs)
		if err := fs.Parse([]string{"--config", filepath.Join(t.TempDir(), "absent.yaml")}); err != nil {
			t.Fatal(err)
		}
		if err := cfg.Load(fs); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("load: %v, want not-exist", err)
		}
	})
}

// TestConfigShippedExample: the example installed as /etc/vgpud/vgpud.yaml
// loads, and every value it shows is the default it says it is.
func TestConfigShippedExample(t *testing.T) {
	data, err := os.ReadFile("../../systemd/vgpud.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := loadWith(t, string(data))
	if err != nil {
		t.Fatalf("the shipped example does not load: %v", err)
	}
	want := Default()
	want.Version = "v1"
	got := *c
	got.file, got.flags, got.reloadable = "", nil, nil
	if !reflect.DeepEqual(settingsMap(&got), settingsMap(want)) {
		t.Fatalf("the example's values differ from the defaults:\n got %v\nwant %v", settingsMap(&got), settingsMap(want))
	}
}

// TestConfigReloadableHolder: a second load (a reload) keeps the holder that
// running parts read, with the new values in it.
func TestConfigReloadableHolder(t *testing.T) {
	c, err := loadWith(t, "ueventSettle: 1s\n")
	if err != nil {
		t.Fatal(err)
	}
	holder := c.reloadable
	next := Default()
	next.flags = c.flags
	if err := next.Load(nil); err != nil {
		t.Fatal(err)
	}
	next.UeventSettle = Duration{3 * time.Second}
	c.ApplyReloadable(next)
	if c.reloadable != holder || c.Reloadable().UeventSettle != 3*time.Second {
		t.Fatalf("holder replaced or not updated: %v", c.Reloadable())
	}
}

// The metrics access keys of vgpud.yaml and their flags: unix: addresses,
// socket mode and group, the web configuration file; every mistake named.
func TestMetricsAccessConfig(t *testing.T) {
	c, err := loadWith(t, "metricsListen: unix:/run/vgpud/metrics.sock\nmetricsSocketMode: \"0640\"\nmetricsSocketGroup: vgpud\nmetricsWebConfigFile: /etc/vgpud/web.yml\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.MetricsListen != "unix:/run/vgpud/metrics.sock" || c.MetricsSocketMode.FileMode() != 0o640 || c.MetricsSocketGroup != "vgpud" || c.MetricsWebConfigFile != "/etc/vgpud/web.yml" {
		t.Fatalf("file values not taken: %+v", c)
	}
	c, err = loadWith(t, "metricsListen: unix:/run/vgpud/metrics.sock\nmetricsSocketMode: \"0640\"\n", "--metrics-socket-mode", "0600", "--metrics-web-config-file", "/etc/x.yml")
	if err != nil {
		t.Fatal(err)
	}
	if c.MetricsSocketMode.FileMode() != 0o600 || c.MetricsWebConfigFile != "/etc/x.yml" {
		t.Fatalf("flags must win over the file: %+v", c)
	}
	c, err = loadWith(t, "metricsListen: unix:/run/vgpud/metrics.sock\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.MetricsSocketMode.FileMode() != 0o660 || c.MetricsSocketGroup != "" {
		t.Fatalf("socket defaults: mode %v group %q, want 0660 and the daemon's", c.MetricsSocketMode.FileMode(), c.MetricsSocketGroup)
	}

	for _, tt := range []struct {
		name, yaml string
		args       []string
		want       string
	}{
		{name: "relative-socket", yaml: "metricsListen: unix:metrics.sock\n", want: "metricsListen: \"unix:metrics.sock\": a Unix socket is unix: and an absolute path"},
		{name: "socket-dir", yaml: "metricsListen: unix:/run/vgpud/\n", want: "a Unix socket is unix: and an absolute path"},
		{name: "socket-too-long", yaml: "metricsListen: unix:/" + strings.Repeat("s", 110) + "\n", want: "at most 102 bytes"},
		{name: "no-port", yaml: "metricsListen: localhost\n", want: "metricsListen: \"localhost\""},
		{name: "mode-without-socket", yaml: "metricsSocketMode: \"0660\"\n", want: "metricsSocketMode, metricsSocketGroup: only with a unix: metricsListen"},
		{name: "group-without-socket", args: []string{"--metrics-socket-group", "vgpud"}, want: "only with a unix: metricsListen"},
		{name: "mode-unquoted", yaml: "metricsListen: unix:/run/m.sock\nmetricsSocketMode: 0660\n", want: "write it quoted"},
		{name: "mode-decimal", yaml: "metricsListen: unix:/run/m.sock\nmetricsSocketMode: \"660\"\n", want: "is not a mode"},
		{name: "mode-too-wide", yaml: "metricsListen: unix:/run/m.sock\nmetricsSocketMode: \"01777\"\n", want: "is not a mode"},
		{name: "mode-no-write", yaml: "metricsListen: unix:/run/m.sock\nmetricsSocketMode: \"0444\"\n", want: "lets no one connect"},
		{name: "relative-web-config", yaml: "metricsWebConfigFile: web.yml\n", want: "metricsWebConfigFile: \"web.yml\" must be an absolute path"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadWith(t, tt.yaml, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("load: %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if _, err := loadWith(t, "", "--metrics-listen", "unix:/run/m.sock", "--metrics-socket-mode", "660"); err == nil || !strings.Contains(err.Error(), "is not a mode") {
		t.Fatalf("--metrics-socket-mode 660: %v", err)
	}
}

func TestConfigFleetSection(t *testing.T) {
	c, err := loadWith(t, "version: v1\nfleet:\n  endpoint: http://127.0.0.1:8778\n  host: gpu-7\n  syncInterval: 30s\n  auditInterval: 10m\n  grace: 90s\n  parentUUID: 9a0e0c3c-0d6f-4a11-8b2e-6f1c2b9e51d2\n  inventories: exact\n  offer:\n    L4-24GB: [L4-4Q, NVIDIA L4-24Q, passthrough]\n")
	if err != nil {
		t.Fatal(err)
	}
	f := c.Fleet
	if f == nil || len(f.Offer["L4-24GB"]) != 3 || f.Inventories != "exact" || f.Endpoint != "http://127.0.0.1:8778" || f.Host != "gpu-7" || f.SyncInterval.Duration != 30*time.Second || f.AuditInterval.Duration != 10*time.Minute || f.Grace.Duration != 90*time.Second || f.ParentUUID == "" {
		t.Fatalf("fleet = %+v", f)
	}
	if _, err := loadWith(t, "version: v1\nfleet:\n  endpont: x\n"); err == nil {
		t.Fatal("a misspelt fleet key was accepted")
	}
	for _, bad := range []string{
		"fleet:\n  endpoint: placement:8778\n",
		"fleet:\n  endpoint: http://admin:secret@p:8778\n",
		"fleet:\n  endpoint: http://p:99999\n",
		"fleet:\n  endpoint: http://p:8778\n  parentUUID: nope\n",
		"fleet:\n  endpoint: http://p:8778\n  grace: -1s\n",
		"fleet:\n  endpoint: http://p:8778\n  auditInterval: -1s\n",
		"fleet:\n  endpoint: http://p:8778\n  auditInterval: 25h\n",
		"fleet:\n  endpoint: http://p:8778\n  auditInterval: ''\n",
		"fleet:\n  endpoint: http://p:8778\n  auditInterval: often\n",
		"fleet:\n  endpoint: http://p:8778\n  inventories: always\n",
		"fleet:\n  endpoint: http://p:8778\n  offer:\n    L4-24GB: []\n",
		"fleet:\n  endpoint: http://p:8778\n  offer:\n    L4-24GB:\n",
		"fleet:\n  endpoint: http://p:8778\n  offer:\n    L4-24GB: ['']\n",
		"fleet:\n  endpoint: http://p:8778\n  offer:\n    L4-24GB: [all]\n",
		"fleet:\n  endpoint: http://p:8778\n  offer:\n    '': [L4-4Q]\n",
		"fleet:\n  endpoint: http://p:8778\n  offer:\n    'not a model': [L4-4Q]\n",
		"fleet:\n  endpoint: http://p:8778\n  offer: [L4-4Q]\n",
		"fleet:\n  endpoint: http://p:8778\n  rootUUID: 9a0e0c3c-0d6f-4a11-8b2e-6f1c2b9e51d2\n  parentUUID: 9a0e0c3c-0d6f-4a11-8b2e-6f1c2b9e51d3\n",
	} {
		if _, err := loadWith(t, "version: v1\n"+bad); err == nil {
			t.Errorf("accepted %q", bad)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("the refusal of %q shows the password: %v", bad, err)
		}
	}
	if !reloadableKeys["fleet"] {
		t.Fatal("fleet is not applied on SIGHUP")
	}
}

func TestChangedSettings(t *testing.T) {
	base := Default()
	tests := []struct {
		name             string
		change           func(c *Config)
		applied, restart string
	}{
		{name: "nothing", change: func(*Config) {}, applied: "[]", restart: "[]"},
		{name: "xids-reordered-is-no-change", change: func(c *Config) {
			c.CriticalXIDs = []uint{120, 119, 95, 94, 79, 64, 62, 48}
		}, applied: "[]", restart: "[]"},
		{name: "reloadable", change: func(c *Config) { c.UeventSettle = Duration{time.Second} }, applied: "[ueventSettle]", restart: "[]"},
		{name: "restart", change: func(c *Config) { c.StateDir = "/srv"; c.LogLevel = "debug" }, applied: "[logLevel]", restart: "[stateDir]"},
		{name: "version-is-not-a-setting", change: func(c *Config) { c.Version = "v1" }, applied: "[]", restart: "[]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := Default()
			tt.change(next)
			a, r := Changed(base, next)
			if fmt.Sprint(a) != tt.applied || fmt.Sprint(r) != tt.restart {
				t.Fatalf("applied %v restart %v, want %s %s", a, r, tt.applied, tt.restart)
			}
		})
	}
}

// TestRunningFollowsReload: what a reload applied is what the next reload
// compares with, so a change is named once, not again at every reload.
func TestRunningFollowsReload(t *testing.T) {
	c, err := loadWith(t, "")
	if err != nil {
		t.Fatal(err)
	}
	next := Default()
	next.LogLevel, next.UeventSettle = "debug", Duration{time.Second}
	if a, r := Changed(c.Running(), next); fmt.Sprint(a) != "[logLevel ueventSettle]" || len(r) != 0 {
		t.Fatalf("first reload: applied %v restart %v", a, r)
	}
	c.ApplyReloadable(next)
	if a, r := Changed(c.Running(), next); len(a) != 0 || len(r) != 0 {
		t.Fatalf("the same file again: applied %v restart %v, want nothing", a, r)
	}
}

// The defaults this package states for other packages' settings are
// theirs.
func TestDefaultsAreThePackagesOwn(t *testing.T) {
	if DefaultGPUConcurrency != manager.DefaultRecoveryConcurrency {
		t.Errorf("DefaultGPUConcurrency %d, the manager's %d", DefaultGPUConcurrency, manager.DefaultRecoveryConcurrency)
	}
	if DefaultApplyMaxChanges != apply.DefaultMaxChanges {
		t.Errorf("DefaultApplyMaxChanges %d, pkg/apply's %d", DefaultApplyMaxChanges, apply.DefaultMaxChanges)
	}
}
