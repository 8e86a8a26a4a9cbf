package nvml

import (
	"context"
	"errors"
	"fmt"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// SetMIGMode enables or disables MIG. It returns nil once the mode is
// current; when the driver leaves it pending (a client holds the GPU, VFs
// are enabled, or the host needs a reset) it returns gpu.ErrResetRequired
// wrapping the activation status, and the change takes effect at the next
// GPU reset. Disabling with GPU instances left fails with gpu.ErrInUse.
func (b *Backend) SetMIGMode(ctx context.Context, uuid string, enable bool) error {
	ctx, release, herr := b.hold(ctx, "SetMIGMode")
	if herr != nil {
		return herr
	}
	defer release()
	d, err := b.device(ctx, uuid)
	if err != nil {
		return err
	}
	mode := gonvml.DEVICE_MIG_DISABLE
	if enable {
		mode = gonvml.DEVICE_MIG_ENABLE
	}
	activation, err := call(ctx, b, "SetMigMode", func() (gonvml.Return, gonvml.Return) { return d.SetMigMode(mode) })
	if err != nil {
		return fmt.Errorf("set MIG mode %v on GPU %s: %w", enable, uuid, err)
	}
	if activation != gonvml.SUCCESS {
		return fmt.Errorf("MIG mode %v on GPU %s is pending (activation: %w): %w", enable, uuid, activation, gpu.ErrResetRequired)
	}
	return nil
}

// CreateGPUInstance creates a GPU instance of real profile id profileID at
// placement start. It is idempotent: an instance of that profile already
// at that start is returned as is.
func (b *Backend) CreateGPUInstance(ctx context.Context, uuid string, profileID, start int) (gpu.GPUInstance, error) {
	ctx, release, herr := b.hold(ctx, "CreateGPUInstance")
	if herr != nil {
		return gpu.GPUInstance{}, herr
	}
	defer release()
	d, err := b.device(ctx, uuid)
	if err != nil {
		return gpu.GPUInstance{}, err
	}
	info, err := b.giProfileInfo(ctx, uuid, d, profileID)
	if err != nil {
		return gpu.GPUInstance{}, err
	}
	if gi, ok, err := b.findGI(ctx, d, &info, start); err != nil || ok {
		return gi, err
	}
	pl := gonvml.GpuInstancePlacement{Start: uint32(start), Size: 0}
	pls, err := call(ctx, b, "GetGpuInstancePossiblePlacements", func() ([]gonvml.GpuInstancePlacement, gonvml.Return) {
		return d.GetGpuInstancePossiblePlacements(&info)
	})
	if err != nil {
		return gpu.GPUInstance{}, fmt.Errorf("placements of profile %d on GPU %s: %w", profileID, uuid, err)
	}
	for _, p := range pls {
		if int(p.Start) == start {
			pl.Size = p.Size
		}
	}
	if pl.Size == 0 {
		return gpu.GPUInstance{}, fmt.Errorf("GPU %s: profile %d cannot start at slot %d: %w", uuid, profileID, start, gpu.ErrInvalid)
	}
	h, err := call(ctx, b, "CreateGpuInstanceWithPlacement", func() (gonvml.GpuInstance, gonvml.Return) { return d.CreateGpuInstanceWithPlacement(&info, &pl) })
	if err != nil {
		return gpu.GPUInstance{}, fmt.Errorf("create GPU instance of profile %d at %d on GPU %s: %w", profileID, start, uuid, err)
	}
	return b.readGI(ctx, h, "")
}

func (b *Backend) findGI(ctx context.Context, d gonvml.Device, info *gonvml.GpuInstanceProfileInfo, start int) (gpu.GPUInstance, bool, error) {
	gis, err := call(ctx, b, "GetGpuInstances", func() ([]gonvml.GpuInstance, gonvml.Return) { return d.GetGpuInstances(info) })
	if err != nil {
		return gpu.GPUInstance{}, false, fmt.Errorf("list GPU instances: %w", err)
	}
	for _, h := range gis {
		gi, err := b.readGI(ctx, h, "")
		if err != nil {
			return gi, false, err
		}
		if gi.Placement.Start == start {
			return gi, true, nil
		}
	}
	return gpu.GPUInstance{}, false, nil
}

func (b *Backend) gpuInstance(ctx context.Context, uuid string, giID int) (gonvml.GpuInstance, error) {
	d, err := b.device(ctx, uuid)
	if err != nil {
		return nil, err
	}
	h, err := call(ctx, b, "GetGpuInstanceById", func() (gonvml.GpuInstance, gonvml.Return) { return d.GetGpuInstanceById(giID) })
	if err != nil {
		return nil, fmt.Errorf("GPU instance %d on GPU %s: %w", giID, uuid, err)
	}
	return h, nil
}

// DestroyGPUInstance destroys GPU instance giID. Idempotent: a missing
// instance is success. Compute instances or vGPUs on it: gpu.ErrInUse.
func (b *Backend) DestroyGPUInstance(ctx context.Context, uuid string, giID int) error {
	ctx, release, herr := b.hold(ctx, "DestroyGPUInstance")
	if herr != nil {
		return herr
	}
	defer release()
	h, err := b.gpuInstance(ctx, uuid, giID)
	if errors.Is(err, gpu.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := b.do(ctx, "GpuInstanceDestroy", h.Destroy); err != nil {
		if errors.Is(err, gpu.ErrInvalid) && b.giGone(ctx, uuid, giID) {
			return nil
		}
		return fmt.Errorf("destroy GPU instance %d on GPU %s: %w", giID, uuid, err)
	}
	return nil
}

// giGone asks again for a GPU instance whose handle the driver just
// called invalid (INVALID_ARGUMENT from a call on it): the instance went
// between the lookup and the call (a reboot, a reset, someone else's
// destroy), which a destroy counts as done. Gone: no such instance now, or
// no MIG on the GPU any more.
func (b *Backend) giGone(ctx context.Context, uuid string, giID int) bool {
	_, err := b.gpuInstance(ctx, uuid, giID)
	return errors.Is(err, gpu.ErrNotFound) || errors.Is(err, gpu.ErrNotSupported)
}

// CreateComputeInstance creates a compute instance in GPU instance giID.
// ciProfile is the compute-instance profile index, or -1 for the one that
// covers the whole GPU instance. start is its placement inside the GPU
// instance, in compute slices (CreateComputeInstanceWithPlacement), or -1
// to let the driver choose. Idempotent: an existing compute instance of
// that profile (at start, when one is given) is returned.
func (b *Backend) CreateComputeInstance(ctx context.Context, uuid string, giID, ciProfile, start int) (gpu.ComputeInstance, error) {
	ctx, release, herr := b.hold(ctx, "CreateComputeInstance")
	if herr != nil {
		return gpu.ComputeInstance{}, herr
	}
	defer release()
	h, err := b.gpuInstance(ctx, uuid, giID)
	if err != nil {
		return gpu.ComputeInstance{}, err
	}
	info, err := b.ciProfileInfo(ctx, uuid, giID, h, ciProfile)
	if err != nil {
		return gpu.ComputeInstance{}, err
	}
	cis, err := call(ctx, b, "GetComputeInstances", func() ([]gonvml.ComputeInstance, gonvml.Return) { return h.GetComputeInstances(&info) })
	if err != nil {
		return gpu.ComputeInstance{}, err
	}
	for _, c := range cis {
		ci, err := readCI(ctx, b, c)
		if err != nil {
			return ci, err
		}
		if start < 0 || ci.Placement.Start == start {
			return ci, nil
		}
	}
	var c gonvml.ComputeInstance
	if start < 0 {
		c, err = call(ctx, b, "CreateComputeInstance", func() (gonvml.ComputeInstance, gonvml.Return) { return h.CreateComputeInstance(&info) })
	} else {
		pl := gonvml.ComputeInstancePlacement{Start: uint32(start), Size: info.SliceCount}
		c, err = call(ctx, b, "CreateComputeInstanceWithPlacement", func() (gonvml.ComputeInstance, gonvml.Return) {
			return h.CreateComputeInstanceWithPlacement(&info, &pl)
		})
	}
	if err != nil {
		return gpu.ComputeInstance{}, fmt.Errorf("create compute instance of profile %d at %d in GPU instance %d on GPU %s: %w", info.Id, start, giID, uuid, err)
	}
	return readCI(ctx, b, c)
}

// ciProfileInfo finds compute-instance profile ciProfile of a GPU
// instance; -1: the one with the most slices, which covers the GI.
func (b *Backend) ciProfileInfo(ctx context.Context, uuid string, giID int, h gonvml.GpuInstance, ciProfile int) (gonvml.ComputeInstanceProfileInfo, error) {
	var info gonvml.ComputeInstanceProfileInfo
	found := false
	for idx := 0; idx < gonvml.COMPUTE_INSTANCE_PROFILE_COUNT; idx++ {
		if ciProfile >= 0 && idx != ciProfile {
			continue
		}
		c, err := call(ctx, b, "GetComputeInstanceProfileInfo", func() (gonvml.ComputeInstanceProfileInfo, gonvml.Return) {
			return h.GetComputeInstanceProfileInfo(idx, gonvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		})
		if errors.Is(err, gpu.ErrNotSupported) || errors.Is(err, gpu.ErrInvalid) {
			continue
		}
		if err != nil {
			return info, err
		}
		if !found || c.SliceCount > info.SliceCount {
			info, found = c, true
		}
	}
	if !found {
		return info, fmt.Errorf("GPU instance %d on GPU %s has no compute-instance profile %d: %w", giID, uuid, ciProfile, gpu.ErrNotSupported)
	}
	return info, nil
}

func readCI(ctx context.Context, b *Backend, c gonvml.ComputeInstance) (gpu.ComputeInstance, error) {
	ci, err := call(ctx, b, "ComputeInstanceGetInfo", c.GetInfo)
	if err != nil {
		return gpu.ComputeInstance{}, err
	}
	return gpu.ComputeInstance{ID: int(ci.Id), ProfileID: int(ci.ProfileId), Placement: gpu.Range{Start: int(ci.Placement.Start), Size: int(ci.Placement.Size)}}, nil
}

// DestroyComputeInstance destroys compute instance ciID of GPU instance
// giID. Idempotent: a missing compute or GPU instance is success.
func (b *Backend) DestroyComputeInstance(ctx context.Context, uuid string, giID, ciID int) error {
	ctx, release, herr := b.hold(ctx, "DestroyComputeInstance")
	if herr != nil {
		return herr
	}
	defer release()
	h, err := b.gpuInstance(ctx, uuid, giID)
	if errors.Is(err, gpu.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	c, err := call(ctx, b, "GetComputeInstanceById", func() (gonvml.ComputeInstance, gonvml.Return) { return h.GetComputeInstanceById(ciID) })
	if errors.Is(err, gpu.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("compute instance %d of GPU instance %d on GPU %s: %w", ciID, giID, uuid, err)
	}
	if err := b.do(ctx, "ComputeInstanceDestroy", c.Destroy); err != nil {
		if errors.Is(err, gpu.ErrInvalid) && b.ciGone(ctx, uuid, giID, ciID) {
			return nil
		}
		return fmt.Errorf("destroy compute instance %d of GPU instance %d on GPU %s: %w", ciID, giID, uuid, err)
	}
	return nil
}

// ciGone is giGone for a compute instance: its GPU instance is gone, or
// no longer holds it.
func (b *Backend) ciGone(ctx context.Context, uuid string, giID, ciID int) bool {
	h, err := b.gpuInstance(ctx, uuid, giID)
	if err != nil {
		return errors.Is(err, gpu.ErrNotFound) || errors.Is(err, gpu.ErrNotSupported)
	}
	_, err = call(ctx, b, "GetComputeInstanceById", func() (gonvml.ComputeInstance, gonvml.Return) { return h.GetComputeInstanceById(ciID) })
	return errors.Is(err, gpu.ErrNotFound)
}

// SetHeterogeneous switches a GPU between homogeneous and mixed-size
// time-sliced vGPUs. Idempotent; gpu.ErrInUse while any vGPU exists,
// gpu.ErrNotSupported with MIG on or on GPUs without the mode.
func (b *Backend) SetHeterogeneous(ctx context.Context, uuid string, on bool) error {
	ctx, release, herr := b.hold(ctx, "SetHeterogeneous")
	if herr != nil {
		return herr
	}
	defer release()
	d, err := b.device(ctx, uuid)
	if err != nil {
		return err
	}
	m := gonvml.VgpuHeterogeneousMode{}
	m.Version = gonvml.STRUCT_VERSION(m, 1)
	if on {
		m.Mode = 1
	}
	if err := b.do(ctx, "SetVgpuHeterogeneousMode", func() gonvml.Return { return d.SetVgpuHeterogeneousMode(m) }); err != nil {
		return fmt.Errorf("set heterogeneous vGPU mode %v on GPU %s: %w", on, uuid, err)
	}
	return nil
}
