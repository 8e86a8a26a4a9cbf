package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// simLatencyCmd is `vgpud sim latency`: the simulated driver's time per
// call. With no argument and no flag it prints the settings in force.
func simLatencyCmd(withHost func(fn func(h *sim.Host, args []string) error) func(*cobra.Command, []string) error) *cobra.Command {
	var l sim.Latency
	var typical, off bool
	cmd := &cobra.Command{
		Use:   "latency [DURATION]",
		Short: "Set the simulated driver's latency: DURATION added to every NVML call, flags per GPU-changing operation",
		Long: `Set how long the simulated driver takes. DURATION (e.g. 50us) is added to
every NVML call. The per-operation flags set how long each GPU-changing
operation takes; calls on one GPU take turns, calls on different GPUs
overlap. --typical sets the figures docs/simulator.md explains (the
per-operation flags given as well override them); --off clears every
per-operation figure. Without arguments it prints the settings in force.`,
		Args: cobra.MaximumNArgs(1),
	}
	f := cmd.Flags()
	f.StringVar(&l.GPUInstanceCreate, "gpu-instance-create", "", "GPU-instance create")
	f.StringVar(&l.GPUInstanceDestroy, "gpu-instance-destroy", "", "GPU-instance destroy")
	f.StringVar(&l.ComputeInstanceCreate, "compute-instance-create", "", "compute-instance create")
	f.StringVar(&l.ComputeInstanceDestroy, "compute-instance-destroy", "", "compute-instance destroy")
	f.StringVar(&l.VGPUType, "vgpu-type", "", "a write of a VF's current_vgpu_type")
	f.StringVar(&l.MdevCreate, "mdev-create", "", "mdev create")
	f.StringVar(&l.MdevRemove, "mdev-remove", "", "mdev remove")
	f.StringVar(&l.MIGMode, "mig-mode", "", "MIG mode change")
	f.Float64Var(&l.Jitter, "jitter", 0, "spread each call's time by up to this fraction either way (0..1)")
	f.BoolVar(&typical, "typical", false, "the typical figures (docs/simulator.md)")
	f.BoolVar(&off, "off", false, "no per-operation latency")
	cmd.RunE = withHost(func(h *sim.Host, args []string) error {
		perOp := false
		for _, n := range []string{"gpu-instance-create", "gpu-instance-destroy", "compute-instance-create", "compute-instance-destroy",
			"vgpu-type", "mdev-create", "mdev-remove", "mig-mode", "jitter", "typical", "off"} {
			perOp = perOp || cmd.Flags().Changed(n)
		}
		if !perOp && len(args) == 0 {
			cur, err := h.LatencySettings()
			if err != nil {
				return err
			}
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(cur)
		}
		if typical && off {
			return usageError{fmt.Errorf("--typical and --off exclude each other")}
		}
		if len(args) == 1 {
			d, err := time.ParseDuration(args[0])
			if err != nil {
				return usageError{fmt.Errorf("DURATION %q: %w", args[0], err)}
			}
			if err := h.SetCallLatency(d); err != nil {
				return err
			}
		}
		if !perOp {
			return nil
		}
		set := l
		if typical {
			set = mergeLatency(sim.TypicalLatency(), l, cmd.Flags().Changed("jitter"))
		} else if !off {
			cur, err := h.LatencySettings()
			if err != nil {
				return err
			}
			set = mergeLatency(cur, l, cmd.Flags().Changed("jitter"))
		}
		if err := h.SetLatency(set); err != nil {
			return usageError{err}
		}
		return nil
	})
	return cmd
}

// mergeLatency lays the figures given on top of base.
func mergeLatency(base, given sim.Latency, jitter bool) sim.Latency {
	pick := func(b, g string) string {
		if g != "" {
			return g
		}
		return b
	}
	out := sim.Latency{
		GPUInstanceCreate:      pick(base.GPUInstanceCreate, given.GPUInstanceCreate),
		GPUInstanceDestroy:     pick(base.GPUInstanceDestroy, given.GPUInstanceDestroy),
		ComputeInstanceCreate:  pick(base.ComputeInstanceCreate, given.ComputeInstanceCreate),
		ComputeInstanceDestroy: pick(base.ComputeInstanceDestroy, given.ComputeInstanceDestroy),
		VGPUType:               pick(base.VGPUType, given.VGPUType),
		MdevCreate:             pick(base.MdevCreate, given.MdevCreate),
		MdevRemove:             pick(base.MdevRemove, given.MdevRemove),
		MIGMode:                pick(base.MIGMode, given.MIGMode),
		Jitter:                 base.Jitter,
	}
	if jitter {
		out.Jitter = given.Jitter
	}
	return out
}
