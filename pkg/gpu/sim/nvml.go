package sim

import (
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// notSupported returns a go-nvml mock whose every function returns zero
// values and ERROR_NOT_SUPPORTED: what a driver answers for a feature it
// lacks. The simulator's types embed it and override what they model, so
// an unmodelled call fails cleanly instead of panicking.
func notSupported[T any]() *T {
	p := new(T)
	v := reflect.ValueOf(p).Elem()
	retType := reflect.TypeOf(nvml.SUCCESS)
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		if f.Kind() != reflect.Func || !f.CanSet() {
			continue
		}
		ft := f.Type()
		f.Set(reflect.MakeFunc(ft, func([]reflect.Value) []reflect.Value {
			out := make([]reflect.Value, ft.NumOut())
			for j := range out {
				if ft.Out(j) == retType {
					out[j] = reflect.ValueOf(nvml.ERROR_NOT_SUPPORTED)
				} else {
					out[j] = reflect.Zero(ft.Out(j))
				}
			}
			return out
		}))
	}
	return p
}

// The not-supported bases are stateless, so one of each serves every handle.
var (
	baseOnce        sync.Once
	baseInterface   *mock.Interface
	baseDevice      *mock.Device
	baseGPUInstance *mock.GpuInstance
	baseCompute     *mock.ComputeInstance
	baseVgpuType    *mock.VgpuTypeId
	baseVgpu        *mock.VgpuInstance
	baseEventSet    *mock.EventSet
)

func bases() {
	baseOnce.Do(func() {
		baseInterface = notSupported[mock.Interface]()
		baseDevice = notSupported[mock.Device]()
		baseGPUInstance = notSupported[mock.GpuInstance]()
		baseCompute = notSupported[mock.ComputeInstance]()
		baseVgpuType = notSupported[mock.VgpuTypeId]()
		baseVgpu = notSupported[mock.VgpuInstance]()
		baseEventSet = notSupported[mock.EventSet]()
	})
}

// lib is the simulated NVML library.
type lib struct {
	*mock.Interface
	h *Host

	// id names the library's NVML sessions (sessions.go).
	id string

	mu    sync.Mutex
	inits int
	// released are the GPUs whose session the library closed (ReleaseGPU).
	released map[string]bool
}

// NVML returns the host's NVML library. Each call returns a new library
// handle with its own Init/Shutdown reference count, as a process has.
func (h *Host) NVML() nvml.Interface {
	bases()
	return &lib{Interface: baseInterface, h: h, id: newLibID()}
}

var _ nvml.Interface = (*lib)(nil)

func (l *lib) initialized() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inits > 0
}

// Init fails with LIBRARY_NOT_FOUND while the simulated driver is absent.
func (l *lib) Init() nvml.Return {
	loaded := false
	ret := l.h.call("Init", -1, false, func(st *state, _ *gpuState) (bool, nvml.Return) {
		loaded = st.DriverLoaded
		return false, nvml.SUCCESS
	})
	if ret != nvml.SUCCESS {
		return ret
	}
	if !loaded {
		return nvml.ERROR_LIBRARY_NOT_FOUND
	}
	l.mu.Lock()
	l.inits++
	first := l.inits == 1
	l.mu.Unlock()
	if first {
		l.openSessions()
	}
	return nvml.SUCCESS
}

func (l *lib) InitWithFlags(uint32) nvml.Return { return l.Init() }

func (l *lib) Shutdown() nvml.Return {
	if ret := l.h.call("Shutdown", -1, false, func(*state, *gpuState) (bool, nvml.Return) { return false, nvml.SUCCESS }); ret != nvml.SUCCESS {
		return ret
	}
	l.mu.Lock()
	if l.inits == 0 {
		l.mu.Unlock()
		return nvml.ERROR_UNINITIALIZED
	}
	l.inits--
	last := l.inits == 0
	l.mu.Unlock()
	if last {
		l.closeSessions()
	}
	return nvml.SUCCESS
}

func (l *lib) ErrorString(r nvml.Return) string { return r.Error() }

// Extensions answers symbol lookups as the current driver's library does:
// it has every function the simulator serves, the _v2 and V calls among
// them. (An unserved function answers NOT_SUPPORTED when called.)
func (l *lib) Extensions() nvml.ExtendedInterface { return symbols{} }

type symbols struct{}

func (symbols) LookupSymbol(string) error { return nil }

func (l *lib) SystemGetDriverVersion() (string, nvml.Return) {
	var v string
	ret := l.libCall("SystemGetDriverVersion", func(st *state) { v = st.Spec.Driver.Version })
	return v, ret
}

func (l *lib) SystemGetNVMLVersion() (string, nvml.Return) {
	var v string
	ret := l.libCall("SystemGetNVMLVersion", func(st *state) { v = st.Spec.Driver.NVMLVersion })
	return v, ret
}

func (l *lib) DeviceGetCount() (int, nvml.Return) {
	n := 0
	ret := l.libCall("DeviceGetCount", func(st *state) { n = len(st.GPUs) })
	return n, ret
}

func (l *lib) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	n, ret := l.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	if i < 0 || i >= n {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return l.h.device(l, i), nvml.SUCCESS
}

func (l *lib) DeviceGetHandleByUUID(uuid string) (nvml.Device, nvml.Return) {
	idx := -1
	ret := l.libCall("DeviceGetHandleByUUID", func(st *state) {
		for i, g := range st.GPUs {
			if g.UUID == uuid {
				idx = i
			}
		}
	})
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	if idx < 0 {
		return nil, nvml.ERROR_NOT_FOUND
	}
	return l.h.device(l, idx), nvml.SUCCESS
}

func (l *lib) DeviceGetHandleByPciBusId(bus string) (nvml.Device, nvml.Return) {
	want := strings.ToLower(bus)
	idx := -1
	ret := l.libCall("DeviceGetHandleByPciBusId", func(st *state) {
		for i, g := range st.GPUs {
			if g.PCI == want || "0000"+g.PCI == want {
				idx = i
			}
		}
	})
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	if idx < 0 {
		return nil, nvml.ERROR_NOT_FOUND
	}
	return l.h.device(l, idx), nvml.SUCCESS
}

func (l *lib) GetVgpuDriverCapabilities(c nvml.VgpuDriverCapability) (bool, nvml.Return) {
	var ok bool
	ret := l.libCall("GetVgpuDriverCapabilities", func(st *state) {
		ok = c == nvml.VGPU_DRIVER_CAP_HETEROGENEOUS_MULTI_VGPU
	})
	return ok, ret
}

func (l *lib) EventSetCreate() (nvml.EventSet, nvml.Return) {
	if ret := l.libCall("EventSetCreate", func(*state) {}); ret != nvml.SUCCESS {
		return nil, ret
	}
	return &eventSet{EventSet: baseEventSet, l: l, regs: map[string]uint64{}}, nvml.SUCCESS
}

// libCall runs a read-only library-level call.
func (l *lib) libCall(op string, fn func(st *state)) nvml.Return {
	if !l.initialized() {
		return nvml.ERROR_UNINITIALIZED
	}
	return l.h.call(op, -1, false, func(st *state, _ *gpuState) (bool, nvml.Return) {
		fn(st)
		return false, nvml.SUCCESS
	})
}

// call is the entry of every simulated NVML call: the configured latency,
// then, under the host lock, fault rules, the lost-GPU rule and fn. write
// says fn may change the state. It returns fn's NVML return code.
func (h *Host) call(op string, gpuIdx int, write bool, fn func(st *state, g *gpuState) (bool, nvml.Return)) nvml.Return {
	if d := time.Duration(h.latency.Load()); d > 0 {
		h.sleep(d)
	}
	var delay time.Duration
	ret := nvml.SUCCESS
	needWrite := false
	run := func(st *state, canWrite bool) bool {
		var g *gpuState
		if gpuIdx >= 0 {
			if gpuIdx >= len(st.GPUs) {
				ret = nvml.ERROR_INVALID_ARGUMENT
				return false
			}
			g = st.GPUs[gpuIdx]
		}
		changed := false
		if hasFault(st, op, g) {
			if !canWrite {
				needWrite = true
				return false
			}
			f, moved := st.checkFault(op, g, false)
			changed = moved
			if f != nil {
				delay = f.delay()
				if f.Return != 0 {
					ret = nvml.Return(f.Return)
					return changed
				}
			}
		}
		if g != nil && g.Lost {
			ret = nvml.ERROR_GPU_IS_LOST
			return changed
		}
		c, r := fn(st, g)
		ret = r
		return changed || c
	}
	var err error
	if write {
		h.timed(nvmlLatClass(op), gpuIdx, func() {
			err = h.mutate(func(st *state) (bool, error) { return run(st, true), nil })
		})
	} else {
		err = h.view(func(st *state) error { run(st, false); return nil })
		if err == nil && needWrite {
			ret = nvml.SUCCESS
			err = h.mutate(func(st *state) (bool, error) { return run(st, true), nil })
		}
	}
	if err != nil {
		h.log.Error("simulated NVML call failed", "op", op, "err", err)
		return nvml.ERROR_UNKNOWN
	}
	if delay > 0 {
		h.sleep(delay)
	}
	return ret
}

func hasFault(st *state, op string, g *gpuState) bool {
	for _, f := range st.Faults {
		if f.Op != op && f.Op != "*" {
			continue
		}
		if strings.Contains(f.Op, ":") {
			continue
		}
		if f.GPU != "" && (g == nil || (f.GPU != g.PCI && f.GPU != g.UUID)) {
			continue
		}
		return true
	}
	return false
}
