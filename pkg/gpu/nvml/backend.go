// Package nvml is the GPU backend on NVIDIA's NVML (github.com/NVIDIA/go-nvml):
// device enumeration, MIG mode and GPU/compute instances with explicit
// placements, vGPU type and instance queries, the vGPU scheduler, utilization
// and events. It drives whatever nvml.Interface it is given: the real library
// (dlopened at Init, so the binary starts on hosts without the driver) or the
// simulator's.
//
// Every call runs with a deadline: a driver call that does not return in
// time is reported as gpu.ErrTimeout, and its effect is unknown until it
// returns (Quiesce waits for that). Errors wrap a pkg/gpu sentinel and the nvml.Return.
//
// Imports: internal/hostcall, pkg/gpu, pkg/profile.
package nvml

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/internal/hostcall"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/profile"
)

// DefaultCallTimeout bounds a driver call when the context has no deadline.
const DefaultCallTimeout = 30 * time.Second

// Observer is told of every NVML call (for metrics); it must not block.
type Observer func(op string, d time.Duration, ret gonvml.Return)

// Backend is the NVML backend.
type Backend struct {
	lib     gonvml.Interface
	cat     *profile.Catalog
	log     *slog.Logger
	observe Observer

	mu sync.Mutex
	// profiles caches, per GPU UUID, the GI profile index of each real id;
	// the table is fixed per GPU.
	profiles map[string]map[int]int
	// known keeps each enumerated GPU's identity by NVML index, so that a GPU
	// that fell off the bus (every query GPU_IS_LOST) is still reported by
	// its UUID and PCI address. The index only bridges one driver session.
	known map[int]gpu.GPU

	// calls counts driver calls that outran their deadline.
	calls hostcall.Tracker

	// symbols caches symbol's answers, by C function name.
	symbols map[string]error

	// gate admits the NVML calls; a GPU reset closes it (gate.go).
	gate gate
	// down is the GPU whose reset shut NVML down ("" while it is up).
	down string
	// reopenTimeout is Options.ReopenTimeout.
	reopenTimeout time.Duration
	// lost is NVML left uninitialized (or maybe so) outside any reset
	// (session.go); lostOn mirrors lost.on for the gate's fast path.
	lost   lostSession
	lostOn atomic.Bool
	// reinit admits one caller at a time to initialize NVML again.
	reinit chan struct{}
}

// Options configure a Backend.
type Options struct {
	Logger   *slog.Logger
	Observer Observer
	// ReopenTimeout bounds the tries of Init after a GPU reset
	// (ReopenSession; default DefaultCallTimeout).
	ReopenTimeout time.Duration
}

// New returns a backend over lib (gonvml.New() on a real host).
func New(lib gonvml.Interface, cat *profile.Catalog, opts Options) *Backend {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reopen := opts.ReopenTimeout
	if reopen <= 0 {
		reopen = DefaultCallTimeout
	}
	return &Backend{lib: lib, cat: cat, log: log, observe: opts.Observer, profiles: map[string]map[int]int{}, known: map[int]gpu.GPU{},
		symbols: map[string]error{}, reopenTimeout: reopen, reinit: make(chan struct{}, 1)}
}

// SetCatalog replaces the catalog used to name models and profiles.
func (b *Backend) SetCatalog(cat *profile.Catalog) {
	b.mu.Lock()
	b.cat = cat
	b.mu.Unlock()
}

func (b *Backend) catalog() *profile.Catalog {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cat
}

// symbol checks that the driver's NVML has the C function name before
// the backend calls it: go-nvml binds functions newer than some drivers
// (the _v2 scheduler calls, nvmlDeviceGetTemperatureV), and a call to one
// the library lacks would end the process instead of returning an error.
// A missing function is gpu.ErrNotSupported. The answer is kept: the
// library does not change under a running process. The lookup is a local
// dlsym, so it needs no deadline.
func (b *Backend) symbol(name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err, ok := b.symbols[name]; ok {
		return err
	}
	var err error
	if ext := b.lib.Extensions(); ext == nil {
		err = fmt.Errorf("%w: NVML %s: the library answers no symbol lookups", gpu.ErrNotSupported, name)
	} else if lerr := ext.LookupSymbol(name); lerr != nil {
		err = fmt.Errorf("%w: NVML %s: this driver's library lacks it (a newer driver has it): %w", gpu.ErrNotSupported, name, lerr)
	}
	b.symbols[name] = err
	return err
}

// wrap turns an nvml.Return into an error carrying the matching gpu sentinel.
func wrap(ret gonvml.Return) error {
	if ret == gonvml.SUCCESS {
		return nil
	}
	var s error
	switch ret {
	case gonvml.ERROR_LIBRARY_NOT_FOUND, gonvml.ERROR_DRIVER_NOT_LOADED, gonvml.ERROR_LIB_RM_VERSION_MISMATCH, gonvml.ERROR_UNINITIALIZED:
		s = gpu.ErrDriverNotLoaded
	case gonvml.ERROR_GPU_IS_LOST:
		s = gpu.ErrGPULost
	case gonvml.ERROR_NOT_SUPPORTED:
		s = gpu.ErrNotSupported
	case gonvml.ERROR_IN_USE:
		s = gpu.ErrInUse
	case gonvml.ERROR_INSUFFICIENT_RESOURCES:
		s = gpu.ErrNoResources
	case gonvml.ERROR_RESET_REQUIRED:
		s = gpu.ErrResetRequired
	case gonvml.ERROR_INVALID_ARGUMENT, gonvml.ERROR_ARGUMENT_VERSION_MISMATCH:
		s = gpu.ErrInvalid
	case gonvml.ERROR_NOT_FOUND:
		s = gpu.ErrNotFound
	case gonvml.ERROR_TIMEOUT:
		s = gpu.ErrTimeout
	default:
		return ret
	}
	return fmt.Errorf("%w: %w", s, ret)
}

// call runs fn inside the session gate (waiting while a GPU reset holds
// it, unless ctx is inside already), with the context's deadline
// (DefaultCallTimeout when it has none), and returns what fn returned, with its code as an error. A driver
// call cannot be interrupted: one that outruns the deadline fails with
// gpu.ErrTimeout and runs on in its own goroutine (Quiesce waits for it).
// fn's result reaches the caller only when fn returned in time, so fn must
// hand back what it reads instead of assigning variables the caller can
// see: an abandoned fn would write them while the caller reads them.
func call[T any](ctx context.Context, b *Backend, op string, fn func() (T, gonvml.Return)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	ctx, release, err := b.hold(ctx, op)
	if err != nil {
		return zero, err
	}
	defer release()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultCallTimeout)
		defer cancel()
	}
	start := time.Now()
	res, err := hostcall.Go(ctx, &b.calls, func() result[T] {
		v, ret := fn()
		return result[T]{v, ret}
	})
	if err != nil {
		if b.observe != nil {
			b.observe(op, time.Since(start), gonvml.ERROR_TIMEOUT)
		}
		b.log.Warn("NVML call did not return in time; its effect is unknown", "op", op, "after", time.Since(start))
		return zero, fmt.Errorf("NVML %s: %w: %w", op, gpu.ErrTimeout, err)
	}
	if b.observe != nil {
		b.observe(op, time.Since(start), res.ret)
	}
	return res.v, wrap(res.ret)
}

// result is what an NVML call returned.
type result[T any] struct {
	v   T
	ret gonvml.Return
}

// call2 is call for the NVML functions that return two values.
func call2[T, U any](ctx context.Context, b *Backend, op string, fn func() (T, U, gonvml.Return)) (T, U, error) {
	v, err := call(ctx, b, op, func() (pair[T, U], gonvml.Return) {
		t, u, ret := fn()
		return pair[T, U]{t, u}, ret
	})
	return v.t, v.u, err
}

type pair[T, U any] struct {
	t T
	u U
}

// do is call for the NVML functions that return only a code. fn may read
// what the caller holds but must not write it.
func (b *Backend) do(ctx context.Context, op string, fn func() gonvml.Return) error {
	_, err := call(ctx, b, op, func() (struct{}, gonvml.Return) { return struct{}{}, fn() })
	return err
}

// Quiesce waits until every driver call that outran its deadline has
// returned, so that what the host shows next includes its effect.
func (b *Backend) Quiesce(ctx context.Context) error {
	return b.calls.Quiesce(ctx)
}

// Init loads NVML. Without the driver it returns gpu.ErrDriverNotLoaded.
func (b *Backend) Init(ctx context.Context) error {
	lost := b.lostOn.Load()
	ctx, release, err := b.hold(ctx, "Init")
	if err != nil {
		return fmt.Errorf("initialize NVML: %w", err)
	}
	defer release()
	if lost {
		// The gate's entry initialized NVML again: another Init would
		// count twice, and a reset's Shutdown would not close it.
		return nil
	}
	if err := b.do(ctx, "Init", b.lib.Init); err != nil {
		return fmt.Errorf("initialize NVML: %w", err)
	}
	return nil
}

// Shutdown releases NVML.
func (b *Backend) Shutdown(ctx context.Context) error {
	return b.do(ctx, "Shutdown", b.lib.Shutdown)
}

// Driver reports the driver and NVML versions.
func (b *Backend) Driver(ctx context.Context) (gpu.DriverInfo, error) {
	ctx, release, herr := b.hold(ctx, "Driver")
	if herr != nil {
		return gpu.DriverInfo{}, herr
	}
	defer release()
	var d gpu.DriverInfo
	var err error
	d.Version, err = call(ctx, b, "SystemGetDriverVersion", b.lib.SystemGetDriverVersion)
	if err != nil {
		return d, fmt.Errorf("driver version: %w", err)
	}
	d.NVMLVersion, err = call(ctx, b, "SystemGetNVMLVersion", b.lib.SystemGetNVMLVersion)
	if err != nil {
		return d, fmt.Errorf("NVML version: %w", err)
	}
	return d, nil
}

// device returns the handle of the GPU with uuid.
func (b *Backend) device(ctx context.Context, uuid string) (gonvml.Device, error) {
	d, err := call(ctx, b, "DeviceGetHandleByUUID", func() (gonvml.Device, gonvml.Return) { return b.lib.DeviceGetHandleByUUID(uuid) })
	if err != nil {
		return nil, fmt.Errorf("GPU %s: %w", uuid, err)
	}
	return d, nil
}

// giProfileInfo resolves a real GI profile id to NVML's profile info on a GPU.
func (b *Backend) giProfileInfo(ctx context.Context, uuid string, d gonvml.Device, id int) (gonvml.GpuInstanceProfileInfo, error) {
	b.mu.Lock()
	idx, ok := b.profiles[uuid][id]
	b.mu.Unlock()
	if !ok {
		table := map[int]int{}
		for i := 0; i < gonvml.GPU_INSTANCE_PROFILE_COUNT; i++ {
			info, err := call(ctx, b, "GetGpuInstanceProfileInfo", func() (gonvml.GpuInstanceProfileInfo, gonvml.Return) { return d.GetGpuInstanceProfileInfo(i) })
			if errors.Is(err, gpu.ErrNotSupported) || errors.Is(err, gpu.ErrInvalid) {
				continue
			}
			if err != nil {
				return info, fmt.Errorf("GPU %s: GPU-instance profile index %d: %w", uuid, i, err)
			}
			table[int(info.Id)] = i
		}
		b.mu.Lock()
		b.profiles[uuid] = table
		b.mu.Unlock()
		if idx, ok = table[id]; !ok {
			return gonvml.GpuInstanceProfileInfo{}, fmt.Errorf("GPU %s has no GPU-instance profile %d: %w", uuid, id, gpu.ErrNotSupported)
		}
	}
	info, err := call(ctx, b, "GetGpuInstanceProfileInfo", func() (gonvml.GpuInstanceProfileInfo, gonvml.Return) { return d.GetGpuInstanceProfileInfo(idx) })
	if err != nil {
		return info, fmt.Errorf("GPU %s: GPU-instance profile %d: %w", uuid, id, err)
	}
	return info, nil
}

func cString(b []int8) string {
	n := 0
	for n < len(b) && b[n] != 0 {
		n++
	}
	out := make([]byte, n)
	for i := 0; i < n; i++ {
		out[i] = byte(b[i])
	}
	return string(out)
}
