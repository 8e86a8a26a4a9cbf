package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/config"
	nvmlbackend "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

// host is the GPU side of the wiring: the catalog and the two backends,
// over the real driver or the simulated host.
type host struct {
	cat   *profile.Catalog
	sim   *sim.Host
	nvml  *nvmlbackend.Backend
	sysfs *sysfs.Sysfs
	// reset resets GPUs for MIG mode changes: the simulated host's, or on
	// a real host the NVML backend's, which pauses every NVML call of the
	// process around the kernel's steps (sysfs.Reset).
	reset manager.GPUResetter
}

func newLogger(cfg *config.Config) *slog.Logger {
	l, _ := newLeveledLogger(cfg)
	return l
}

// newLeveledLogger returns a logger whose level SIGHUP can change.
func newLeveledLogger(cfg *config.Config) (*slog.Logger, *slog.LevelVar) {
	lvl, _ := cfg.Level()
	v := &slog.LevelVar{}
	v.Set(lvl)
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: v})), v
}

func loadCatalog(cfg *config.Config) (*profile.Catalog, error) {
	cat, err := profile.Load(profiles.FS, cfg.ProfilesDir)
	if err != nil {
		return nil, fmt.Errorf("load GPU catalog: %w", err)
	}
	return cat, nil
}

// openSim opens (creating on first use) the simulated host under the state dir.
func openSim(cfg *config.Config, cat *profile.Catalog, log *slog.Logger) (*sim.Host, error) {
	var spec *sim.Spec
	if cfg.SimHost != "" {
		s, err := sim.LoadSpec(cfg.SimHost)
		if err != nil {
			return nil, err
		}
		spec = s
	}
	return sim.Open(cfg.SimDir(), spec, cat, sim.OpenOptions{Logger: log.With("component", "sim"), Mirror: cfg.SimMirror})
}

func openHost(cfg *config.Config, log *slog.Logger, observe nvmlbackend.Observer) (*host, error) {
	cat, err := loadCatalog(cfg)
	if err != nil {
		return nil, err
	}
	h := &host{cat: cat}
	var lib gonvml.Interface
	var fsys sysfs.FS
	var mdevctl string
	if cfg.Sim {
		sh, err := openSim(cfg, cat, log)
		if err != nil {
			return nil, err
		}
		h.sim = sh
		lib, fsys, mdevctl = sh.NVML(), sh.FS(), sh.MdevctlDir()
	} else {
		lib, fsys = gonvml.New(), sysfs.OSFS{Root: cfg.SysfsRoot}
		mdevctl = cfg.MdevctlDir
	}
	h.nvml = nvmlbackend.New(lib, cat, nvmlbackend.Options{Logger: log.With("component", "nvml"), Observer: observe})
	if h.sim != nil {
		r, err := h.sim.Resetter(lib)
		if err != nil {
			return nil, err
		}
		h.reset = r
	} else {
		// The holders of a GPU are read from the real /proc whatever the
		// sysfs root: they are this host's processes.
		h.reset = h.nvml.Resetter(sysfs.Reset{Sys: fsys, Proc: sysfs.OSFS{Root: "/proc"}, Self: os.Getpid()})
	}
	h.sysfs = sysfs.New(fsys)
	if mdevctl != "" {
		h.sysfs.WithMdevctl(mdevctl)
	}
	return h, nil
}

// bootID names the host's current boot: a GPU failed in an earlier boot
// was reset by the reboot. "" when it cannot be read.
func (h *host) bootID() string {
	if h.sim != nil {
		id, _ := h.sim.BootID()
		return id
	}
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func (h *host) Close() {
	if h.sim != nil {
		h.sim.Close()
	}
}
