package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/vgpud/vgpud/pkg/config"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// simMIGCmds are what an administrator does to MIG behind vgpud's back
// (nvidia-smi mig -dci/-dgi, -cgi/-cci), done through the simulated
// driver's NVML so it refuses what the driver refuses (sim.Host's
// CreateGPUInstance and DestroyGPUInstance).
func simMIGCmds(cfg *config.Config) []*cobra.Command {
	withHost := withSimHost(cfg)
	destroy := &cobra.Command{
		Use:   "destroy-gi GPU ID",
		Short: "Destroy a MIG GPU instance and its compute instances by hand, as nvidia-smi mig -dci -gi ID; nvidia-smi mig -dgi -gi ID",
		Args:  cobra.ExactArgs(2),
		RunE: withHost(func(h *sim.Host, a []string) error {
			id, err := strconv.Atoi(a[1])
			if err != nil || id < 0 {
				return usageError{fmt.Errorf("GPU instance id %q: not a number", a[1])}
			}
			return h.DestroyGPUInstance(a[0], id)
		}),
	}
	create := &cobra.Command{
		Use:   "create-gi GPU PROFILE-INDEX",
		Short: "Create a MIG GPU instance with one compute instance by hand, as nvidia-smi mig -cgi PROFILE -C (PROFILE-INDEX: NVML's GPU instance profile index, e.g. 0 for 1g)",
		Args:  cobra.ExactArgs(2),
		RunE: withHost(func(h *sim.Host, a []string) error {
			idx, err := strconv.Atoi(a[1])
			if err != nil || idx < 0 {
				return usageError{fmt.Errorf("profile index %q: not a number", a[1])}
			}
			id, err := h.CreateGPUInstance(a[0], idx)
			if err == nil {
				fmt.Printf("GPU instance %d\n", id)
			}
			return err
		}),
	}
	return []*cobra.Command{destroy, create}
}
