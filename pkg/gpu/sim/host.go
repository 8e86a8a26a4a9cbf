// Package sim is the simulated GPU host every test and the demo run on. It
// sits below the real backends: a fake NVML built on go-nvml's interfaces
// (NVML returns an nvml.Interface) and a sysfs view (FS) whose writes have
// the kernel's and the driver's effects. Both are views of one model of the
// hardware, kept in state.json in the host's directory, so the simulated
// GPUs keep their MIG layout and vGPUs when the daemon dies, and lose them
// on a simulated reboot, as real ones do. The sysfs view is an in-memory
// tree rendered from that state (again for a GPU whose state changed);
// with OpenOptions.Mirror it is also written under the host's directory
// (SysRoot) for people and tools that read files.
//
// The simulator refuses what the driver refuses, with the driver's NVML
// return codes and errno values (see the host-interfaces reference). What
// the GPUs do with the work their instances submit (scheduler, clocks,
// power, utilization, ground truth) is the workload engine's,
// pkg/gpu/sim/workload: the simulator describes each GPU to it and serves
// the telemetry calls from what it reports.
//
// It imports pkg/gpu, pkg/gpu/sim/workload, pkg/profile and pkg/uevent
// (UeventSource); only cmd/, test harnesses, benchmarks and tests import
// it.
//
// Imports: pkg/gpu, pkg/gpu/sim/workload, pkg/profile, pkg/uevent.
package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim/workload"
	"github.com/vgpud/vgpud/pkg/profile"
)

// Errors of the simulator's own API (not the driver's).
var (
	ErrSpecMismatch = errors.New("simulated host directory holds another host")
	ErrBadState     = errors.New("simulated host state unreadable")
	ErrNoSuchGPU    = errors.New("no such simulated GPU")
	ErrNoSuchDevice = errors.New("no such vGPU device")
)

// Host is one simulated host rooted at a directory:
//
//	DIR/state.json   the hardware and driver state
//	DIR/lock         flock'ed by every operation (several processes may share a host)
//	DIR/sys/         the sysfs tree's mirror, with OpenOptions.Mirror (FS reads and writes the tree)
type Host struct {
	dir string
	// state is DIR/state.json (every call stats it: joined once).
	state string
	cat   *profile.Catalog
	log   *slog.Logger

	mu    sync.Mutex
	lock  *os.File
	st    *state
	stamp fileStamp
	// latency is read by every NVML call without the host lock.
	latency atomic.Int64
	// ops is the per-operation latency model (latency.go), read without
	// the host lock; serial serialises the timed calls per GPU.
	ops    atomic.Pointer[latencyModel]
	serial gpuSerial
	// tree is the sysfs tree the state implies; FS reads are served from it.
	tree *tree
	// mirror: also keep the tree on disk under DIR/sys (for people and
	// tools that read files). rendered caches what was last written there,
	// so that a mutation rewrites only what changed; nil means unknown.
	mirror   bool
	rendered map[string]entry
	sleep    func(time.Duration)
	// eng is the workload model's runtime (engine.go), guarded by mu.
	eng *workload.Engine
	// notify wakes event waiters at every change (notify.go).
	notify notifier
}

// OpenOptions configure Open.
type OpenOptions struct {
	// Logger receives the simulated driver's log lines.
	Logger *slog.Logger
	// Mirror keeps the sysfs tree on disk under DIR/sys as well. Every
	// read goes through FS either way; the mirror costs a file write per
	// changed attribute.
	Mirror bool
}

// Open opens the simulated host in dir, creating it from spec when dir
// holds none. A dir created from another spec is refused unless spec is nil
// (nil: use whatever dir holds, or the default host when it is new).
func Open(dir string, spec *Spec, cat *profile.Catalog, opts OpenOptions) (*Host, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create simulated host directory: %w", err)
	}
	lf, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open simulated host lock: %w", err)
	}
	h := &Host{dir: dir, state: filepath.Join(dir, "state.json"), cat: cat, log: log, lock: lf, mirror: opts.Mirror, sleep: time.Sleep}
	if err := h.flock(unix.LOCK_EX); err != nil {
		lf.Close()
		return nil, err
	}
	defer h.funlock()
	_, statErr := os.Stat(h.statePath())
	switch {
	case statErr == nil:
		if err := h.load(); err != nil {
			lf.Close()
			return nil, err
		}
		if spec != nil {
			if err := spec.Validate(cat); err != nil {
				lf.Close()
				return nil, err
			}
			if !sameHardware(spec, &h.st.Spec) {
				lf.Close()
				return nil, fmt.Errorf("%w: %s was created from another host description; remove it or open it without one", ErrSpecMismatch, dir)
			}
		}
	case errors.Is(statErr, fs.ErrNotExist):
		if spec == nil {
			spec = DefaultSpec()
		}
		if err := spec.Validate(cat); err != nil {
			lf.Close()
			return nil, err
		}
		h.st = newState(spec)
		if err := h.attachModels(); err != nil {
			lf.Close()
			return nil, err
		}
		h.boot()
		if err := h.save(); err != nil {
			lf.Close()
			return nil, err
		}
	default:
		lf.Close()
		return nil, fmt.Errorf("stat simulated host state: %w", statErr)
	}
	h.setLatency(&h.st.Spec)
	h.updateTree()
	if err := h.writeMirror(); err != nil {
		lf.Close()
		return nil, err
	}
	return h, nil
}

func (h *Host) setLatency(s *Spec) {
	d, _ := s.callLatency()
	h.latency.Store(int64(d))
	h.ops.Store(newLatencyModel(s.Options.Latency))
}

// Close releases the host's files; the state stays on disk.
func (h *Host) Close() error {
	h.closeNotify()
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lock.Close()
}

// Dir is the host's directory.
func (h *Host) Dir() string { return h.dir }

// SysRoot is the root of the simulated sysfs tree (what /sys is on a host).
func (h *Host) SysRoot() string { return filepath.Join(h.dir, "sys") }

func (h *Host) statePath() string { return h.state }

func sameHardware(a, b *Spec) bool {
	if len(a.GPUs) != len(b.GPUs) {
		return false
	}
	for i := range a.GPUs {
		x, y := a.GPUs[i], b.GPUs[i]
		if x.Model != y.Model || x.PCI != y.PCI || x.UUID != y.UUID || x.Flavour != y.Flavour {
			return false
		}
	}
	return true
}

func newState(spec *Spec) *state {
	st := &state{Version: stateVersion, Spec: *spec, DriverLoaded: !spec.Driver.Absent, NextHandle: 3251637444, NextGroup: 70}
	if st.Spec.Driver.Version == "" {
		st.Spec.Driver.Version = "580.65.05"
	}
	if st.Spec.Driver.NVMLVersion == "" {
		st.Spec.Driver.NVMLVersion = "13." + st.Spec.Driver.Version
	}
	for _, g := range spec.GPUs {
		gs := &gpuState{Model: g.Model, PCI: g.PCI, UUID: g.UUID, Flavour: string(g.Flavour), NUMANode: g.NUMANode,
			MIGCurrent: g.MIG, MIGPending: g.MIG, Heterogeneous: g.Heterogeneous}
		gs.IOMMUGroup = st.NextGroup
		st.NextGroup++
		st.GPUs = append(st.GPUs, gs)
	}
	return st
}

// boot brings the host to its just-booted state: nothing carved, VFs as the
// boot unit leaves them.
func (h *Host) boot() {
	st := h.st
	st.Boot++
	for i, g := range st.GPUs {
		spec := st.Spec.GPUs[i]
		g.GIs, g.Mdevs = nil, nil
		g.Lost = false
		g.Sched = sched{Policy: nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT}
		g.Heterogeneous = spec.Heterogeneous
		if st.Spec.Options.MIGModeLostOnReboot {
			g.MIGCurrent, g.MIGPending = false, false
		} else {
			// A pending mode is committed by the reset a reboot implies.
			g.MIGCurrent = g.MIGPending
		}
		wantVFs := g.model.VGPU != nil && g.model.VGPU.SRIOVVFs > 0 && g.Flavour != string(gpu.FlavourNone)
		if spec.VFs != nil {
			wantVFs = *spec.VFs
		}
		if st.Boot > 1 && st.Spec.Options.VFsRestoredOnReboot != nil && !*st.Spec.Options.VFsRestoredOnReboot {
			wantVFs = false
		}
		h.setVFs(g, wantVFs)
	}
	st.Workloads = nil
}

func (h *Host) setVFs(g *gpuState, on bool) {
	g.VFs = nil
	g.VFsEnabled = on
	if !on {
		return
	}
	pf, _ := gpu.ParsePCI(g.PCI)
	for n := 0; n < g.model.VGPU.SRIOVVFs; n++ {
		g.VFs = append(g.VFs, &vf{PCI: gpu.VFAddress(pf, 4, 1, n).String(), IOMMUGroup: h.st.NextGroup})
		h.st.NextGroup++
	}
}

func (h *Host) attachModels() error {
	for _, g := range h.st.GPUs {
		m, ok := h.cat.Model(g.Model)
		if !ok {
			return fmt.Errorf("%w: GPU %s has model %q, which the catalog lacks", ErrBadState, g.PCI, g.Model)
		}
		g.model = m
	}
	return nil
}

func (h *Host) flock(how int) error {
	for {
		err := unix.Flock(int(h.lock.Fd()), how)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EINTR) {
			return fmt.Errorf("lock simulated host: %w", err)
		}
	}
}

func (h *Host) funlock() { _ = unix.Flock(int(h.lock.Fd()), unix.LOCK_UN) }

func (h *Host) load() error {
	f, err := os.Open(h.statePath())
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadState, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadState, err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadState, err)
	}
	var st state
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrBadState, h.statePath(), err)
	}
	if st.Version != stateVersion {
		return fmt.Errorf("%w: %s has format %d, this build reads %d", ErrBadState, h.statePath(), st.Version, stateVersion)
	}
	h.st = &st
	if err := h.attachModels(); err != nil {
		return err
	}
	h.stamp = stampOf(fi, st.Generation, tokenOf(f))
	h.rendered = nil
	h.setLatency(&st.Spec)
	h.tree = nil
	h.updateTree()
	return nil
}

// save writes state.json: temp file, then rename. A simulated mutation is
// in the file before the call returns, so it outlives every process that
// uses the simulated host, as a real GPU's state outlives the daemon.
func (h *Host) save() error {
	data, err := json.Marshal(h.st)
	if err != nil {
		return fmt.Errorf("encode simulated host state: %w", err)
	}
	tmp := h.statePath() + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("write simulated host state: %w", err)
	}
	// Not fsynced: the state must survive the death of the processes that
	// use it (kill -9), which the page cache assures; a power cut takes a
	// real GPU's state too.
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write simulated host state: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write simulated host state: %w", err)
	}
	token := tag(tmp)
	if err := os.Rename(tmp, h.statePath()); err != nil {
		return fmt.Errorf("write simulated host state: %w", err)
	}
	fi, err := os.Stat(h.statePath())
	if err != nil {
		return fmt.Errorf("stat simulated host state: %w", err)
	}
	h.stamp = stampOf(fi, h.st.Generation, token)
	return nil
}

// syncLocked reloads state.json when another process changed it. Callers
// hold h.mu and the file lock.
func (h *Host) syncLocked() error {
	if h.current() {
		return nil
	}
	return h.load()
}

// view runs fn on the current state without changing it.
//
// A writer replaces state.json by rename, so a state.json whose stamp is
// the one this host last loaded or wrote is the committed state: the read
// then needs no file lock (the NVML pollers read many times a second; see
// stamp.go).
func (h *Host) view(fn func(st *state) error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.current() {
		return fn(h.st)
	}
	if err := h.flock(unix.LOCK_SH); err != nil {
		return err
	}
	defer h.funlock()
	if err := h.syncLocked(); err != nil {
		return err
	}
	return fn(h.st)
}

// mutate runs fn on the state; when fn reports a change the state is saved
// durably and the sysfs tree re-rendered before mutate returns.
func (h *Host) mutate(fn func(st *state) (changed bool, err error)) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.flock(unix.LOCK_EX); err != nil {
		return err
	}
	defer h.funlock()
	if err := h.syncLocked(); err != nil {
		return err
	}
	changed, err := fn(h.st)
	if !changed {
		return err
	}
	h.st.Generation++
	if serr := h.save(); serr != nil {
		// fn's change is in memory only: drop it (the next call reads the
		// committed state again), so that this process neither sees a change
		// no other one sees nor commits it with its next write.
		h.stamp = fileStamp{}
		return serr
	}
	defer h.changed()
	h.updateTree()
	if rerr := h.writeMirror(); rerr != nil {
		return rerr
	}
	return err
}

// Generation returns the state's mutation counter.
func (h *Host) Generation() (uint64, error) {
	var g uint64
	err := h.view(func(st *state) error { g = st.Generation; return nil })
	return g, err
}

// Reboot simulates a host reboot: MIG instances, vGPUs, mdevs, VF types,
// heterogeneous mode and scheduler settings are gone; MIG mode survives or
// not per Options; VFs come back if the boot unit restores them.
func (h *Host) Reboot() error {
	return h.mutate(func(st *state) (bool, error) {
		h.boot()
		st.DriverLoaded = !st.Spec.Driver.Absent
		return true, nil
	})
}

// ResetGPU simulates `nvidia-smi -r`: refused with IN_USE while a VM
// holds a vGPU, vGPUs, mdevs or GPU instances exist, the GPU's SR-IOV VFs
// are enabled or a process holds an NVML session on it (the error names
// each); otherwise commits a pending MIG mode and returns heterogeneous
// mode and the vGPU scheduler to the driver's defaults (homogeneous, best
// effort), as a reset does (docs/simulator.md).
func (h *Host) ResetGPU(id string) error {
	return h.mutate(func(st *state) (bool, error) {
		g := st.gpu(id)
		if g == nil {
			return false, fmt.Errorf("%w: %s", ErrNoSuchGPU, id)
		}
		if why := g.resetBlockers(); why != "" {
			return false, fmt.Errorf("reset GPU %s: %s: %w", g.PCI, why, nvml.ERROR_IN_USE)
		}
		g.MIGCurrent = g.MIGPending
		g.Lost = false
		forgetSettings(g)
		return true, nil
	})
}

// SetDriverLoaded simulates the NVIDIA driver being loaded or not. An
// unload forgets what the module keeps in memory only: each GPU's
// heterogeneous mode and vGPU scheduler and its GPU instances' schedulers.
func (h *Host) SetDriverLoaded(on bool) error {
	return h.mutate(func(st *state) (bool, error) {
		st.DriverLoaded = on
		if !on {
			for _, g := range st.GPUs {
				forgetSettings(g)
				for _, x := range g.GIs {
					x.Sched = nil
				}
			}
		}
		return true, nil
	})
}

// forgetSettings returns a GPU's heterogeneous mode and vGPU scheduler to
// the driver's defaults: neither outlives a GPU reset, a VF rebind or a
// module reload.
func forgetSettings(g *gpuState) {
	g.Heterogeneous = false
	g.Sched = sched{Policy: nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT}
}

// SetVFs simulates sriov-manage -e / -d on a GPU. Enabling a GPU whose
// VFs are enabled changes nothing (re-running -e is harmless, reference
// 2.1). Otherwise the driver rebind destroys every GPU instance and resets
// heterogeneous mode; disabling also takes the VFs' vGPUs and, on a legacy
// mdev GPU, the mdevs whose parents were the VFs. Refused with IN_USE
// (unbindLock) while a VM holds one of them.
func (h *Host) SetVFs(id string, on bool) error {
	return h.mutate(func(st *state) (bool, error) {
		g := st.gpu(id)
		if g == nil {
			return false, fmt.Errorf("%w: %s", ErrNoSuchGPU, id)
		}
		if g.model.VGPU == nil || g.model.VGPU.SRIOVVFs == 0 {
			return false, fmt.Errorf("GPU %s has no SR-IOV", g.PCI)
		}
		if on && g.VFsEnabled {
			return false, nil
		}
		for _, v := range g.vgpus() {
			if v.VM != "" {
				return false, fmt.Errorf("sriov-manage: cannot obtain unbindLock for %s: VM %s holds a vGPU: %w", g.PCI, v.VM, nvml.ERROR_IN_USE)
			}
		}
		if hs := g.holders(); !on && len(hs) > 0 {
			return false, fmt.Errorf("sriov-manage: cannot obtain unbindLock for %s: NVML sessions are open by %s: %w", g.PCI, strings.Join(hs, ", "), nvml.ERROR_IN_USE)
		}
		if !on {
			vfs := map[string]bool{}
			for _, v := range g.VFs {
				vfs[v.PCI] = true
			}
			kept := g.Mdevs[:0]
			for _, m := range g.Mdevs {
				if !vfs[m.Parent] {
					kept = append(kept, m)
				}
			}
			g.Mdevs = kept
		}
		h.setVFs(g, on)
		g.GIs = nil
		forgetSettings(g)
		return true, nil
	})
}

// RebindVFs simulates `sriov-manage -d` then `-e` on a GPU whose VFs are
// enabled (or just `-e` where they are not): the VFs are re-created
// empty, their vGPUs and the mdevs they parent are gone, every GPU
// instance is destroyed, and heterogeneous mode and the vGPU scheduler
// are back at the driver's defaults. Refused with IN_USE (unbindLock)
// while a VM holds a vGPU of the GPU.
func (h *Host) RebindVFs(id string) error {
	if err := h.SetVFs(id, false); err != nil {
		return err
	}
	return h.SetVFs(id, true)
}

// LoseGPU simulates the GPU falling off the bus: XID 79, then every NVML
// call on it returns GPU_IS_LOST and sysfs writes fail with EIO.
func (h *Host) LoseGPU(id string) error {
	return h.mutate(func(st *state) (bool, error) {
		g := st.gpu(id)
		if g == nil {
			return false, fmt.Errorf("%w: %s", ErrNoSuchGPU, id)
		}
		g.Lost = true
		st.emit(g, nvml.EventTypeXidCriticalError, 79, invalidID, invalidID)
		return true, nil
	})
}

// RecoverGPU brings a lost GPU back, as a reset or a driver reload does:
// its instances are gone and its settings back at the driver's defaults.
func (h *Host) RecoverGPU(id string) error {
	return h.mutate(func(st *state) (bool, error) {
		g := st.gpu(id)
		if g == nil {
			return false, fmt.Errorf("%w: %s", ErrNoSuchGPU, id)
		}
		if !g.Lost {
			return false, nil
		}
		g.Lost = false
		g.GIs, g.Mdevs = nil, nil
		for _, v := range g.VFs {
			v.VGPU = nil
		}
		forgetSettings(g)
		return true, nil
	})
}

// InjectXID queues an XID event on a GPU (gi is the GPU instance it is
// scoped to, or -1).
func (h *Host) InjectXID(id string, xid uint64, giID int) error {
	return h.mutate(func(st *state) (bool, error) {
		g := st.gpu(id)
		if g == nil {
			return false, fmt.Errorf("%w: %s", ErrNoSuchGPU, id)
		}
		gid := uint32(invalidID)
		if giID >= 0 {
			gid = uint32(giID)
		}
		st.emit(g, nvml.EventTypeXidCriticalError, xid, gid, invalidID)
		return true, nil
	})
}

// AddFault adds an injected fault.
func (h *Host) AddFault(f Fault) error {
	if f.Op == "" {
		return errors.New("fault needs an op")
	}
	if f.Delay != "" {
		if _, err := time.ParseDuration(f.Delay); err != nil {
			return fmt.Errorf("fault delay: %w", err)
		}
	}
	return h.mutate(func(st *state) (bool, error) {
		st.Faults = append(st.Faults, f)
		return true, nil
	})
}

// ClearFaults removes every injected fault.
func (h *Host) ClearFaults() error {
	return h.mutate(func(st *state) (bool, error) {
		changed := len(st.Faults) > 0
		st.Faults = nil
		return changed, nil
	})
}

// SetCallLatency sets the latency added to every NVML call.
func (h *Host) SetCallLatency(d time.Duration) error {
	return h.mutate(func(st *state) (bool, error) {
		st.Spec.Options.CallLatency = d.String()
		h.latency.Store(int64(d))
		return true, nil
	})
}

// OpenDevice simulates QEMU opening a vGPU (a VM starting with it): the vGPU
// becomes active in NVML with the VM's UUID. dev is an mdev UUID or a VF
// PCI address.
func (h *Host) OpenDevice(dev, vmUUID, vmName string) error {
	return h.mutate(func(st *state) (bool, error) {
		v, _ := st.findVGPU(dev)
		if v == nil {
			return false, fmt.Errorf("%w: %s", ErrNoSuchDevice, dev)
		}
		if v.VM != "" && v.VM != vmUUID {
			return false, fmt.Errorf("vGPU %s is open by VM %s: %w", dev, v.VM, syscall.EBUSY)
		}
		v.VM, v.VMName = vmUUID, vmName
		return true, nil
	})
}

// CloseDevice simulates the VM's QEMU exiting.
func (h *Host) CloseDevice(dev string) error {
	return h.mutate(func(st *state) (bool, error) {
		v, _ := st.findVGPU(dev)
		if v == nil {
			return false, fmt.Errorf("%w: %s", ErrNoSuchDevice, dev)
		}
		changed := v.VM != ""
		v.VM, v.VMName = "", ""
		return changed, nil
	})
}

func (st *state) gpu(id string) *gpuState {
	for _, g := range st.GPUs {
		if g.PCI == id || g.UUID == id {
			return g
		}
	}
	return nil
}

// findVGPU finds the vGPU carried by an mdev UUID or a VF address.
func (st *state) findVGPU(dev string) (*vgpu, *gpuState) {
	for _, g := range st.GPUs {
		for _, v := range g.VFs {
			if v.PCI == dev && v.VGPU != nil {
				return v.VGPU, g
			}
		}
		for _, m := range g.Mdevs {
			if m.UUID == dev {
				return m.VGPU, g
			}
		}
	}
	return nil, nil
}

func (st *state) emit(g *gpuState, typ, data uint64, giID, ciID uint32) {
	st.NextEvent++
	st.Events = append(st.Events, event{Seq: st.NextEvent, GPU: g.UUID, Type: typ, Data: data, GI: giID, CI: ciID, UnixNano: time.Now().UnixNano()})
	if len(st.Events) > maxEvents {
		st.Events = st.Events[len(st.Events)-maxEvents:]
	}
}

// checkFault applies the fault rules to an operation; it returns the fault
// that fires (and whether the state changed because a counter moved).
func (st *state) checkFault(op string, g *gpuState, sysfs bool) (*Fault, bool) {
	for i := range st.Faults {
		f := &st.Faults[i]
		if f.Op != op && !(f.Op == "*" && !sysfs) {
			continue
		}
		if f.GPU != "" && (g == nil || (f.GPU != g.PCI && f.GPU != g.UUID)) {
			continue
		}
		if f.Skip > 0 {
			f.Skip--
			return nil, true
		}
		fired := *f
		if f.Count > 0 {
			f.Count--
			if f.Count == 0 {
				st.Faults = append(st.Faults[:i], st.Faults[i+1:]...)
			}
		}
		return &fired, true
	}
	return nil, false
}

// GPUs lists the simulated GPUs' PCI addresses and UUIDs, in order.
func (h *Host) GPUs() ([][2]string, error) {
	var out [][2]string
	err := h.view(func(st *state) error {
		for _, g := range st.GPUs {
			out = append(out, [2]string{g.PCI, g.UUID})
		}
		return nil
	})
	return out, err
}

// Summary is a short text picture of the host for tests and the CLI: one
// line per GPU with its MIG layout and vGPUs.
func (h *Host) Summary() (string, error) {
	var out string
	err := h.view(func(st *state) error {
		for _, g := range st.GPUs {
			out += fmt.Sprintf("%s %s mig=%v/%v lost=%v vfs=%v", g.PCI, g.Model, g.MIGCurrent, g.MIGPending, g.Lost, g.VFsEnabled)
			gis := append([]*gi(nil), g.GIs...)
			sort.Slice(gis, func(i, j int) bool { return gis[i].Start < gis[j].Start })
			for _, x := range gis {
				sched := ""
				if x.Sched != nil {
					// The GPU instance's own scheduler, once set (GB20x).
					sched = fmt.Sprintf(",sched=%s/%v", policyName(x.Sched.Policy), time.Duration(x.Sched.TimesliceNs))
				}
				out += fmt.Sprintf(" gi%d(p%d@%d+%d,ci=%d%s)", x.ID, x.ProfileID, x.Start, x.Size, len(x.CIs), sched)
			}
			for _, v := range g.VFs {
				if v.VGPU != nil {
					out += fmt.Sprintf(" vf%s=t%d", v.PCI, v.VGPU.Type)
				}
			}
			for _, m := range g.Mdevs {
				out += fmt.Sprintf(" mdev%s=t%d", m.UUID[:8], m.VGPU.Type)
			}
			out += "\n"
		}
		return nil
	})
	return out, err
}
