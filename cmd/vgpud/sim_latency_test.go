package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/config"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// simLatency runs `vgpud sim latency ARGS` on the simulated host in dir
// and returns the per-operation settings it left.
func simLatency(t *testing.T, dir string, args ...string) (sim.Latency, error) {
	t.Helper()
	cfg := config.Default()
	root := rootCmd(cfg, func(context.Context, *config.Config) error { return nil })
	root.SetArgs(append([]string{"--state-dir", dir, "--profiles-dir", "", "sim", "latency"}, args...))
	err := root.Execute()
	h := openSimHost(t, cfg)
	l, lerr := h.LatencySettings()
	if lerr != nil {
		t.Fatal(lerr)
	}
	h.Close()
	return l, err
}

func TestSimLatencyCommand(t *testing.T) {
	dir := t.TempDir()
	typical := sim.TypicalLatency()
	l, err := simLatency(t, dir, "--typical", "--mdev-create", "80ms")
	if err != nil {
		t.Fatal(err)
	}
	want := typical
	want.MdevCreate = "80ms"
	if l != want {
		t.Fatalf("--typical --mdev-create 80ms set %+v, want %+v", l, want)
	}
	// A single flag changes that figure and keeps the others.
	if l, err = simLatency(t, dir, "--vgpu-type", "20ms", "--jitter", "0"); err != nil {
		t.Fatal(err)
	}
	want.VGPUType, want.Jitter = "20ms", 0
	if l != want {
		t.Fatalf("--vgpu-type 20ms --jitter 0 set %+v, want %+v", l, want)
	}
	// Refusals change nothing and are usage errors.
	for _, bad := range [][]string{{"--mig-mode", "1h"}, {"--jitter", "2"}, {"--gpu-instance-create", "soon"}, {"--typical", "--off"}, {"fast"}} {
		got, err := simLatency(t, dir, bad...)
		var u usageError
		if !errors.As(err, &u) || got != want {
			t.Fatalf("sim latency %s: %v (usage error: %v), settings %+v", strings.Join(bad, " "), err, errors.As(err, &u), got)
		}
	}
	if l, err = simLatency(t, dir, "--off"); err != nil || l != (sim.Latency{}) {
		t.Fatalf("--off: %+v, %v", l, err)
	}
}
