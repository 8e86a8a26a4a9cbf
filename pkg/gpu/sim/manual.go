package sim

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// What an administrator does to MIG by hand, behind vgpud's back (the
// `vgpud sim create-gi` and `destroy-gi` verbs, and tests of drift).

// nvmlDevice opens an NVML session and finds a GPU by PCI address; close
// ends the session.
func nvmlDevice(lib nvml.Interface, pci string) (dev nvml.Device, close func(), err error) {
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

// DestroyGPUInstance destroys GPU instance id on the GPU at pci and its
// compute instances, as an administrator does behind vgpud's back
// (nvidia-smi mig -dci -gi ID; nvidia-smi mig -dgi -gi ID): through the
// host's NVML, so it is refused where the driver refuses.
func (h *Host) DestroyGPUInstance(pci string, id int) error {
	dev, done, err := nvmlDevice(h.NVML(), pci)
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

// CreateGPUInstance creates a GPU instance of NVML's profile index idx on
// the GPU at pci, with one compute instance spanning it (nvidia-smi mig
// -cgi PROFILE -C), through the host's NVML; it returns the GPU
// instance's id.
func (h *Host) CreateGPUInstance(pci string, idx int) (int, error) {
	dev, done, err := nvmlDevice(h.NVML(), pci)
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
