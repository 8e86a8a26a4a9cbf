package main

import (
	"fmt"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// simMIGCmds are what an administrator does to MIG behind vgpud's back
// (nvidia-smi mig -dci/-dgi, -cgi/-cci), done through the simulated
// driver's NVML so it refuses what the driver refuses.
func simMIGCmds(cfg *Config) []*cobra.Command {
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
			return simDestroyGI(h.NVML(), a[0], id)
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
			id, err := simCreateGI(h.NVML(), a[0], idx)
			if err == nil {
				fmt.Printf("GPU instance %d\n", id)
			}
			return err
		}),
	}
	return []*cobra.Command{destroy, create}
}

// simDevice opens NVML and finds a GPU by PCI address; close ends the
// NVML session.
func simDevice(lib nvml.Interface, pci string) (dev nvml.Device, close func(), err error) {
	if r := lib.Init(); r != nvml.SUCCESS {
		return nil, nil, fmt.Errorf("NVML init: %w", r)
	}
	dev, r := lib.DeviceGetHandleByPciBusId(pci)
	if r != nvml.SUCCESS {
		lib.Shutdown()
		return nil, nil, fmt.Errorf("GPU %s: %w", pci, r)
	}
	return dev, func() { lib.Shutdown() }, nil
}

func simDestroyGI(lib nvml.Interface, pci string, id int) error {
	dev, done, err := simDevice(lib, pci)
	if err != nil {
		return err
	}
	defer done()
	gi, r := dev.GetGpuInstanceById(id)
	if r != nvml.SUCCESS {
		return fmt.Errorf("GPU instance %d on %s: %w", id, pci, r)
	}
	// The driver refuses to destroy a GPU instance that still holds compute
	// instances (IN_USE): they go first, as with nvidia-smi.
	for p := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, r := gi.GetComputeInstanceProfileInfo(p, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if r != nvml.SUCCESS {
			continue // a profile this GPU instance does not offer
		}
		cis, r := gi.GetComputeInstances(&info)
		if r != nvml.SUCCESS {
			return fmt.Errorf("compute instances of GPU instance %d on %s: %w", id, pci, r)
		}
		for _, ci := range cis {
			if r := ci.Destroy(); r != nvml.SUCCESS {
				return fmt.Errorf("destroy a compute instance of GPU instance %d on %s: %w", id, pci, r)
			}
		}
	}
	if r := gi.Destroy(); r != nvml.SUCCESS {
		return fmt.Errorf("destroy GPU instance %d on %s: %w", id, pci, r)
	}
	return nil
}

func simCreateGI(lib nvml.Interface, pci string, idx int) (int, error) {
	dev, done, err := simDevice(lib, pci)
	if err != nil {
		return 0, err
	}
	defer done()
	info, r := dev.GetGpuInstanceProfileInfo(idx)
	if r != nvml.SUCCESS {
		return 0, fmt.Errorf("GPU instance profile %d on %s: %w", idx, pci, r)
	}
	gi, r := dev.CreateGpuInstance(&info)
	if r != nvml.SUCCESS {
		return 0, fmt.Errorf("create GPU instance of profile %d on %s: %w", idx, pci, r)
	}
	gInfo, r := gi.GetInfo()
	if r != nvml.SUCCESS {
		return 0, fmt.Errorf("GPU instance info: %w", r)
	}
	// The whole GPU instance as one compute instance (nvidia-smi's -C).
	for p := nvml.COMPUTE_INSTANCE_PROFILE_COUNT - 1; p >= 0; p-- {
		ciInfo, r := gi.GetComputeInstanceProfileInfo(p, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if r != nvml.SUCCESS || ciInfo.SliceCount != info.SliceCount {
			continue
		}
		if _, r := gi.CreateComputeInstance(&ciInfo); r != nvml.SUCCESS {
			return int(gInfo.Id), fmt.Errorf("create the compute instance of GPU instance %d: %w", gInfo.Id, r)
		}
		return int(gInfo.Id), nil
	}
	return int(gInfo.Id), fmt.Errorf("GPU instance %d: no compute instance profile spans it", gInfo.Id)
}
