package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/config"
)

// $VGPUD_STATE_DIR is --state-dir's default: `vgpud sim` verbs find the
// daemon's state without the flag; the flag still wins.
func TestStateDirFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(config.StateDirEnv, dir)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", "/dev/null"}, dir},
		{[]string{"--config", "/dev/null", "--state-dir", "/srv/other"}, "/srv/other"},
	} {
		var got string
		cfg := config.Default()
		root := rootCmd(cfg, func(_ context.Context, c *config.Config) error { got = c.StateDir; return nil })
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
		root := rootCmd(config.Default(), func(context.Context, *config.Config) error { return nil })
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
	root := rootCmd(config.Default(), func(context.Context, *config.Config) error { return nil })
	var out strings.Builder
	root.SetOut(&out)
	root.SetArgs([]string{"--help"})
	if err := root.Execute(); err != nil || !strings.Contains(out.String(), "--metrics-listen") {
		t.Errorf("vgpud --help: %v\n%s", err, out.String())
	}
}

// A configuration that does not validate is a usage error: exit status 2.
func TestConfigInvalidIsUsageError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "vgpud.yaml")
	if err := os.WriteFile(file, []byte("logLevel: loud\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := rootCmd(config.Default(), func(context.Context, *config.Config) error { return nil })
	root.SetArgs([]string{"--config", file})
	err := root.Execute()
	var ec exitCoder
	if !errors.As(err, &ec) || ec.ExitCode() != 2 {
		t.Fatalf("%v: want exit status 2", err)
	}
}
