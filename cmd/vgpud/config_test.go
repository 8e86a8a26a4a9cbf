package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// loadWith loads a configuration from file content and flags, as main does.
func loadWith(t *testing.T, yaml string, args ...string) (*Config, error) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "vgpud.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := defaultConfig()
	fs := pflag.NewFlagSet("vgpud", pflag.ContinueOnError)
	cfg.bindFlags(fs)
	if err := fs.Parse(append([]string{"--config", file}, args...)); err != nil {
		return nil, err
	}
	return cfg, cfg.load(fs)
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
		var ec exitCoder
		if !errors.As(err, &ec) || ec.ExitCode() != 2 {
			t.Fatalf("%v: want exit status 2", err)
		}
	})
	t.Run("missing-explicit-file", func(t *testing.T) {
		cfg := defaultConfig()
		fs := pflag.NewFlagSet("vgpud", pflag.ContinueOnError)
		cfg.bindFlags(fs)
		if err := fs.Parse([]string{"--config", filepath.Join(t.TempDir(), "absent.yaml")}); err != nil {
			t.Fatal(err)
		}
		if err := cfg.load(fs); !errors.Is(err, os.ErrNotExist) {
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
	want := defaultConfig()
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
	next := defaultConfig()
	next.flags = c.flags
	if err := next.load(nil); err != nil {
		t.Fatal(err)
	}
	next.UeventSettle = Duration{3 * time.Second}
	c.applyReloadable(next)
	if c.reloadable != holder || c.Reloadable().UeventSettle != 3*time.Second {
		t.Fatalf("holder replaced or not updated: %v", c.Reloadable())
	}
}

// $VGPUD_STATE_DIR is --state-dir's default: `vgpud sim` verbs find the
// daemon's state without the flag; the flag still wins.
func TestStateDirFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(StateDirEnv, dir)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", "/dev/null"}, dir},
		{[]string{"--config", "/dev/null", "--state-dir", "/srv/other"}, "/srv/other"},
	} {
		var got string
		cfg := defaultConfig()
		root := rootCmd(cfg, func(_ context.Context, c *Config) error { got = c.StateDir; return nil })
		root.SetArgs(c.args)
		if err := root.Execute(); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%v: state dir %q, want %q", c.args, got, c.want)
		}
	}
}

// `vgpud sim --help` lists the flags sim verbs read, not the daemon's.
func TestSimHelpListsSimFlags(t *testing.T) {
	for _, args := range [][]string{{"sim", "--help"}, {"sim", "reboot", "--help"}} {
		root := rootCmd(defaultConfig(), func(context.Context, *Config) error { return nil })
		var out strings.Builder
		root.SetOut(&out)
		root.SetArgs(args)
		if err := root.Execute(); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"--state-dir", "--sim-host"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%v: help lacks %s:\n%s", args, want, out.String())
			}
		}
		for _, not := range []string{"--metrics-listen", "--libvirt-socket", "--critical-xids", "--bus-address"} {
			if strings.Contains(out.String(), not) {
				t.Errorf("%v: help lists the daemon's %s:\n%s", args, not, out.String())
			}
		}
	}
	// The daemon's own help still lists them.
	root := rootCmd(defaultConfig(), func(context.Context, *Config) error { return nil })
	var out strings.Builder
	root.SetOut(&out)
	root.SetArgs([]string{"--help"})
	if err := root.Execute(); err != nil || !strings.Contains(out.String(), "--metrics-listen") {
		t.Errorf("vgpud --help: %v\n%s", err, out.String())
	}
}
