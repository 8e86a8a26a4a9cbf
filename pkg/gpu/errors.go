package gpu

import "errors"

// Sentinel errors every backend wraps, next to the driver's own code (an
// nvml.Return or an errno), so the manager can tell failures apart without
// knowing which backend failed.
var (
	// ErrDriverNotLoaded: NVML cannot be loaded or the kernel driver is absent.
	ErrDriverNotLoaded = errors.New("NVIDIA driver not loaded")
	// ErrGPULost: the GPU fell off the bus (NVML GPU_IS_LOST, XID 79).
	ErrGPULost = errors.New("GPU is lost")
	// ErrNotSupported: the GPU or its current mode does not support the call.
	ErrNotSupported = errors.New("not supported by the GPU or its current mode")
	// ErrInUse: something still uses the resource (compute instances on a GPU
	// instance, a VM holding a vGPU).
	ErrInUse = errors.New("in use")
	// ErrNoResources: the driver has no room (placement taken, count exhausted,
	// type not creatable now).
	ErrNoResources = errors.New("insufficient resources")
	// ErrResetRequired: a MIG mode change is pending until the GPU is reset.
	ErrResetRequired = errors.New("GPU reset required")
	// ErrInvalid: the driver rejected an argument.
	ErrInvalid = errors.New("invalid argument")
	// ErrExists: a device with the identity asked for exists already (an
	// mdev UUID, EEXIST). It is not the caller's for that: whoever made it,
	// this call did not.
	ErrExists = errors.New("already exists")
	// ErrNotFound: the instance or device does not exist.
	ErrNotFound = errors.New("not found")
	// ErrTimeout: the call did not return within its deadline; its effect is unknown.
	ErrTimeout = errors.New("driver call timed out")
	// ErrResetting: a GPU reset holds the driver session (NVML's belongs
	// to the whole process), and the call's deadline passed before the
	// reset ended; the call never reached the driver.
	ErrResetting = errors.New("a GPU reset holds the driver session")
)
