package main

import (
	"context"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestFlagHelpReadsRight: every flag's help shows a placeholder of its own
// and one default. A back-quoted word in a flag's usage becomes its
// placeholder in help ("--tenant vgpuctl tenant list"), and a usage that
// spells its default while the flag has one shows two.
func TestFlagHelpReadsRight(t *testing.T) {
	t.Setenv("VGPUCTL_CONNECT", "unix:path=/run/somewhere")
	a := &app{dial: func(context.Context, string) (api, error) { return nil, nil }}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		check := func(f *pflag.Flag) {
			if strings.Contains(f.Usage, "`") {
				t.Errorf("%s --%s: usage %q has a back-quoted word, which help shows as the flag's placeholder", c.CommandPath(), f.Name, f.Usage)
			}
			if strings.Contains(f.Usage, "(default") && f.DefValue != "" && f.DefValue != "false" && f.DefValue != "[]" {
				t.Errorf("%s --%s: usage %q spells a default beside the flag's own %q: help shows two", c.CommandPath(), f.Name, f.Usage, f.DefValue)
			}
		}
		c.Flags().VisitAll(check)
		c.PersistentFlags().VisitAll(check)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(a.rootCmd())
}

// TestApplyWithNothingToDo: one line says so, with or without --dry-run
// (not "no changes were needed" and then "0 changes done").
func TestApplyWithNothingToDo(t *testing.T) {
	for _, args := range [][]string{{"apply", "-f", "testdata/layout.yaml"}, {"apply", "-f", "testdata/layout.yaml", "--dry-run"}} {
		out, errOut, code := runFake(&fake{applyNothing: true}, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		if want := "no changes: the host already matches layout.yaml\n"; out != want {
			t.Errorf("%v printed %q, want %q", args, out, want)
		}
	}
}

// An NVIDIA config with entries for other models, applied again: no
// change, and the skipped entries under that line, never "would change:".
func TestApplyNothingToDoWithSkippedEntries(t *testing.T) {
	skipped := "skipped mig-configs.all-balanced[0]: no GPU of this host matches the device filter 0x294110DE\n"
	for _, args := range [][]string{{"apply", "-f", "testdata/layout.yaml"}, {"apply", "-f", "testdata/layout.yaml", "--dry-run"}} {
		out, errOut, code := runFake(&fake{applyNothing: true, applySummary: skipped}, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		if want := "no changes: the host already matches layout.yaml\n  " + skipped; out != want {
			t.Errorf("%v printed %q, want %q", args, out, want)
		}
	}
}
