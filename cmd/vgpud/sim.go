package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/vgpud/vgpud/pkg/config"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// withSimHost makes a sim subcommand's RunE: it loads the configuration and
// opens the simulated host for fn.
func withSimHost(cfg *config.Config) func(fn func(h *sim.Host, args []string) error) func(*cobra.Command, []string) error {
	return func(fn func(h *sim.Host, args []string) error) func(*cobra.Command, []string) error {
		return func(c *cobra.Command, args []string) error {
			if err := loadConfig(cfg, c.Flags()); err != nil {
				return err
			}
			cat, err := loadCatalog(cfg)
			if err != nil {
				return err
			}
			h, err := openSim(cfg, cat, newLogger(cfg))
			if err != nil {
				return err
			}
			defer h.Close()
			return fn(h, args)
		}
	}
}

// simCmd drives the simulated host: what a real host's hardware, kernel or
// administrator would do (reboot, lose a GPU, inject faults). It works
// while the daemon runs: both share the host's directory and lock.
func simCmd(cfg *config.Config) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Drive the simulated GPU host (reboot, faults, GPU loss, VM device use)",
	}
	withHost := withSimHost(cfg)
	sub := func(use, short string, args cobra.PositionalArgs, fn func(h *sim.Host, args []string) error) *cobra.Command {
		return &cobra.Command{Use: use, Short: short, Args: args, RunE: withHost(fn)}
	}
	cmd.AddCommand(
		sub("summary", "Print the simulated hardware state", cobra.NoArgs, func(h *sim.Host, _ []string) error {
			s, err := h.Summary()
			fmt.Print(s)
			return err
		}),
		sub("reboot", "Simulate a host reboot: MIG instances, vGPUs and mdevs are gone", cobra.NoArgs, func(h *sim.Host, _ []string) error {
			return h.Reboot()
		}),
		resetGPUCmd(withHost),
		sub("vf-rebind GPU", "Simulate sriov-manage -d then -e: VFs re-created empty; GPU instances, heterogeneous mode and the scheduler lost", cobra.ExactArgs(1), func(h *sim.Host, a []string) error {
			return h.RebindVFs(a[0])
		}),
		sub("nvml-client GPU open|close NAME", "Simulate another NVML client (dcgm, an exporter) holding the GPU or letting it go", cobra.ExactArgs(3), func(h *sim.Host, a []string) error {
			if a[1] == "open" {
				return h.OpenSession(a[0], a[2])
			}
			return h.CloseSession(a[0], a[2])
		}),
		sub("lose-gpu GPU", "Simulate the GPU falling off the bus (XID 79)", cobra.ExactArgs(1), func(h *sim.Host, a []string) error {
			return h.LoseGPU(a[0])
		}),
		sub("recover-gpu GPU", "Bring a lost GPU back (its instances are gone)", cobra.ExactArgs(1), func(h *sim.Host, a []string) error {
			return h.RecoverGPU(a[0])
		}),
		sub("vfs GPU on|off", "Simulate sriov-manage -e / -d", cobra.ExactArgs(2), func(h *sim.Host, a []string) error {
			return h.SetVFs(a[0], a[1] == "on")
		}),
		sub("driver load|unload", "Simulate the NVIDIA driver being loaded or not (an unload forgets heterogeneous mode and the schedulers)", cobra.ExactArgs(1), func(h *sim.Host, a []string) error {
			return h.SetDriverLoaded(a[0] == "load")
		}),
		sub("close-device DEV", "Simulate the VM using an mdev UUID or VF address stopping", cobra.ExactArgs(1), func(h *sim.Host, a []string) error {
			return h.CloseDevice(a[0])
		}),
		sub("fault-clear", "Remove every injected fault", cobra.NoArgs, func(h *sim.Host, _ []string) error {
			return h.ClearFaults()
		}),
	)
	var gi int
	xid := sub("xid GPU CODE", "Queue an XID event", cobra.ExactArgs(2), func(h *sim.Host, a []string) error {
		code, err := strconv.ParseUint(a[1], 10, 32)
		if err != nil {
			return usageError{fmt.Errorf("XID %q: %w", a[1], err)}
		}
		return h.InjectXID(a[0], code, gi)
	})
	xid.Flags().IntVar(&gi, "gpu-instance", -1, "GPU instance the XID is scoped to")
	var vmUUID, vmName string
	open := sub("open-device DEV", "Simulate a VM starting with an mdev UUID or VF address (the vGPU becomes active)", cobra.ExactArgs(1), func(h *sim.Host, a []string) error {
		if vmUUID == "" {
			return usageError{fmt.Errorf("--vm-uuid is required")}
		}
		return h.OpenDevice(a[0], vmUUID, vmName)
	})
	open.Flags().StringVar(&vmUUID, "vm-uuid", "", "UUID of the VM")
	open.Flags().StringVar(&vmName, "vm-name", "", "name of the VM")
	var f sim.Fault
	fault := sub("fault", "Inject a fault into NVML calls or sysfs operations", cobra.NoArgs, func(h *sim.Host, _ []string) error {
		return h.AddFault(f)
	})
	fault.Flags().StringVar(&f.Op, "op", "", `NVML method ("CreateGpuInstanceWithPlacement", "*") or sysfs "write:<attr>" / "read:<attr>"`)
	fault.Flags().StringVar(&f.GPU, "gpu", "", "limit to one GPU (PCI address or UUID)")
	fault.Flags().IntVar(&f.Return, "return", 0, "NVML return code to fail with")
	fault.Flags().IntVar(&f.Errno, "errno", 0, "errno a sysfs operation fails with")
	fault.Flags().StringVar(&f.Delay, "delay", "", "delay added to the call")
	fault.Flags().IntVar(&f.Count, "count", 0, "fire this many times (0: forever)")
	fault.Flags().IntVar(&f.Skip, "skip", 0, "let this many matching calls pass first")
	cmd.AddCommand(xid, open, fault, simLatencyCmd(withHost))
	cmd.AddCommand(simWorkloadCmds(cfg)...)
	cmd.AddCommand(simMIGCmds(cfg)...)
	return cmd
}

// resetGPUCmd is `vgpud sim reset-gpu`: nvidia-smi -r, which the driver
// refuses while the GPU's VFs are enabled; --vfs-off does what an
// operator does around it (sriov-manage -d, the reset, sriov-manage -e).
func resetGPUCmd(withHost func(func(*sim.Host, []string) error) func(*cobra.Command, []string) error) *cobra.Command {
	var vfsOff bool
	c := &cobra.Command{
		Use:   "reset-gpu GPU",
		Short: "Simulate nvidia-smi -r: commit a pending MIG mode; heterogeneous mode and the scheduler revert",
		Args:  cobra.ExactArgs(1),
	}
	c.RunE = withHost(func(h *sim.Host, a []string) error {
		if !vfsOff {
			return h.ResetGPU(a[0])
		}
		if err := h.SetVFs(a[0], false); err != nil {
			return err
		}
		if err := h.ResetGPU(a[0]); err != nil {
			return err
		}
		return h.SetVFs(a[0], true)
	})
	c.Flags().BoolVar(&vfsOff, "vfs-off", false, "disable the GPU's SR-IOV VFs around the reset (sriov-manage -d, then -e)")
	return c
}
