package main

import (
	"log/slog"
	"testing"

	"github.com/vgpud/vgpud/pkg/config"
	nvmlbackend "github.com/vgpud/vgpud/pkg/gpu/nvml"
)

// On a real host the manager resets GPUs through the NVML backend's
// session gate (a MIG mode change that needs a reset is carried through,
// not left to an operator). Building the host loads no driver: NVML is
// opened at Init.
func TestRealHostResetsThroughNVML(t *testing.T) {
	cfg := config.Default()
	cfg.Sim = false
	cfg.SysfsRoot = t.TempDir()
	h, err := openHost(cfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, ok := h.reset.(*nvmlbackend.Resetter); !ok {
		t.Fatalf("real host's resetter: %T, want the NVML backend's", h.reset)
	}
}
