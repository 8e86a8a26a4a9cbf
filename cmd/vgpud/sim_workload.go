package main

import (
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/vgpud/vgpud/pkg/config"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sim/workload"
)

// simWorkloadCmds drive the simulated host's workload model: what the
// tenants' VMs and jobs run (vgpud sim workload, workloads, power-cap).
func simWorkloadCmds(cfg *config.Config) []*cobra.Command {
	withHost := withSimHost(cfg)
	var w workload.Workload
	var kernel, period time.Duration
	var clear bool
	set := &cobra.Command{
		Use:   "workload DEV [idle|steady|bursty|noisy]",
		Short: "Set what runs on a vGPU (mdev UUID or VF address) or MIG instance (GPU/giN)",
		Long: `Set the workload of a vGPU (mdev UUID or VF address; it runs while a VM has the
vGPU open, see open-device) or a MIG GPU instance (GPU/giN, GPU a PCI address or UUID).
The demand is the fraction of the whole GPU the workload would use alone; noisy wants
the whole GPU in long, power-hungry kernels. --clear removes it.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: withHost(func(h *sim.Host, a []string) error {
			if clear {
				return h.ClearWorkload(a[0])
			}
			if len(a) < 2 {
				return usageError{fmt.Errorf("a workload kind is required (idle, steady, bursty, noisy) unless --clear")}
			}
			w.Kind, w.KernelNs, w.PeriodNs = a[1], int64(kernel), int64(period)
			return h.SetWorkload(a[0], w)
		}),
	}
	f := set.Flags()
	f.Float64Var(&w.Demand, "demand", 0, "mean demand as a fraction of the GPU, 0..1 (default: the kind's)")
	f.DurationVar(&kernel, "kernel", 0, "kernel length at full clock (default: the kind's)")
	f.DurationVar(&period, "period", 0, "bursty: mean on+off period (default 400ms)")
	f.Float64Var(&w.Duty, "duty", 0, "bursty: fraction of the period on (default 0.4)")
	f.Float64Var(&w.Power, "power", 0, "power per unit of compute, 1 typical (default: the kind's)")
	f.Float64Var(&w.FB, "fb", 0, "framebuffer in use as a fraction of the instance's (default: the kind's)")
	f.Uint64Var(&w.Seed, "seed", 0, "seed of a bursty trace")
	f.BoolVar(&clear, "clear", false, "remove the device's workload")

	list := &cobra.Command{
		Use:   "workloads",
		Short: "List the simulated workloads",
		Args:  cobra.NoArgs,
		RunE: withHost(func(h *sim.Host, _ []string) error {
			ws, err := h.Workloads()
			if err != nil {
				return err
			}
			keys := make([]string, 0, len(ws))
			for k := range ws {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				x := ws[k]
				fmt.Printf("%s\t%s\tdemand=%g\tkernel=%v\tpower=%g\tfb=%g\n", k, x.Kind, x.Demand, time.Duration(x.KernelNs), x.Power, x.FB)
			}
			return nil
		}),
	}
	powerCap := &cobra.Command{
		Use:   "power-cap GPU WATTS",
		Short: "Cap a GPU's power (0 removes the cap), as nvidia-smi -pl does",
		Args:  cobra.ExactArgs(2),
		RunE: withHost(func(h *sim.Host, a []string) error {
			watts, err := strconv.Atoi(a[1])
			if err != nil {
				return usageError{fmt.Errorf("watts %q: %w", a[1], err)}
			}
			return h.SetPowerCap(a[0], watts)
		}),
	}
	return []*cobra.Command{set, list, powerCap}
}
