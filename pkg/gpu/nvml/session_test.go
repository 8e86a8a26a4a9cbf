package nvml_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
)

const (
	resetUUID = "GPU-reset"
	resetPCI  = "0000:41:00.0"
)

// journal is what the driver and the kernel saw, in order.
type journal struct {
	mu  sync.Mutex
	ops []string
}

func (j *journal) add(op string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.ops = append(j.ops, op)
}

func (j *journal) list() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.ops)
}

// resetSys is a PCI device's sysfs attributes in memory; a write is
// journaled and fails with fail[attr] when set.
type resetSys struct {
	j     *journal
	mu    sync.Mutex
	files map[string]string
	fail  map[string]error
}

func (s *resetSys) rel(name string) string {
	return strings.TrimPrefix(name, "bus/pci/devices/"+resetPCI+"/")
}

func (s *resetSys) ReadFile(name string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.files[s.rel(name)]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return []byte(v), nil
}

func (s *resetSys) WriteFile(name string, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	attr := s.rel(name)
	s.j.add("write " + attr + " " + string(data))
	if err := s.fail[attr]; err != nil {
		return &fs.PathError{Op: "write", Path: name, Err: err}
	}
	if attr != "reset" {
		s.files[attr] = string(data) + "\n"
	}
	return nil
}

func (s *resetSys) ReadDir(name string) ([]fs.DirEntry, error) {
	return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
}

func (s *resetSys) Readlink(name string) (string, error) {
	if s.rel(name) == "driver" {
		return "../../../bus/pci/drivers/nvidia", nil
	}
	return "", &fs.PathError{Op: "readlink", Path: name, Err: fs.ErrNotExist}
}

func (s *resetSys) Stat(name string) (fs.FileInfo, error) {
	return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrNotExist}
}

// resetRig is a backend over a mock NVML with one GPU, whose handle is a
// new one in every session, and a resetter over resetSys. A handle used
// outside its session fails the test.
type resetRig struct {
	t   *testing.T
	j   *journal
	sys *resetSys
	lib *mock.Interface
	b   *nvmlb.Backend
	r   *nvmlb.Resetter

	mu      sync.Mutex
	session int  // sessions begun (Init calls that succeeded)
	up      bool // between Init and Shutdown
	// block, when set, holds GetActiveVgpus until it is closed.
	block   chan struct{}
	entered chan struct{}
	initErr gonvml.Return
}

// heldRead starts a read of the GPU that the driver holds until block is
// closed, and returns once the read is inside the driver; read gets its
// outcome. Later reads are not held.
func (rig *resetRig) heldRead(ctx context.Context) (block chan struct{}, read chan error) {
	block, entered := make(chan struct{}), make(chan struct{})
	rig.mu.Lock()
	rig.block, rig.entered = block, entered
	rig.mu.Unlock()
	read = make(chan error, 1)
	go func() {
		_, err := rig.b.Probe(resetUUID).ActiveVGPUCount(ctx)
		read <- err
	}()
	<-entered
	rig.mu.Lock()
	rig.block, rig.entered = nil, nil
	rig.mu.Unlock()
	return block, read
}

func newResetRig(t *testing.T, opts nvmlb.Options) *resetRig {
	j := &journal{}
	rig := &resetRig{t: t, j: j, lib: &mock.Interface{}, sys: &resetSys{j: j, fail: map[string]error{}, files: map[string]string{
		"vendor": "0x10de\n", "sriov_totalvfs": "16\n", "sriov_numvfs": "16\n",
	}}}
	rig.lib.InitFunc = func() gonvml.Return {
		rig.mu.Lock()
		defer rig.mu.Unlock()
		j.add("Init")
		if rig.initErr != gonvml.SUCCESS {
			return rig.initErr
		}
		rig.session++
		rig.up = true
		return gonvml.SUCCESS
	}
	rig.lib.ShutdownFunc = func() gonvml.Return {
		rig.mu.Lock()
		defer rig.mu.Unlock()
		j.add("Shutdown")
		rig.up = false
		return gonvml.SUCCESS
	}
	rig.lib.DeviceGetHandleByUUIDFunc = func(uuid string) (gonvml.Device, gonvml.Return) {
		rig.mu.Lock()
		defer rig.mu.Unlock()
		if !rig.up {
			t.Errorf("DeviceGetHandleByUUID(%s) while NVML is shut down", uuid)
			return nil, gonvml.ERROR_UNINITIALIZED
		}
		if uuid != resetUUID {
			return nil, gonvml.ERROR_NOT_FOUND
		}
		j.add(fmt.Sprintf("handle %d", rig.session))
		return rig.device(rig.session), gonvml.SUCCESS
	}
	rig.b = nvmlb.New(rig.lib, nil, opts)
	rig.r = rig.b.Resetter(sysfs.Reset{Sys: rig.sys, Proc: rig.sys, Poll: time.Millisecond})
	if err := rig.b.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return rig
}

// device is the GPU's handle of session n: it answers GetActiveVgpus
// with n vGPUs, and fails the test when used in another session.
func (rig *resetRig) device(n int) *mock.Device {
	d := &mock.Device{}
	valid := func(op string) bool {
		rig.mu.Lock()
		defer rig.mu.Unlock()
		if !rig.up || rig.session != n {
			rig.t.Errorf("%s on the handle of session %d in session %d (NVML up: %v)", op, n, rig.session, rig.up)
			return false
		}
		return true
	}
	d.GetActiveVgpusFunc = func() ([]gonvml.VgpuInstance, gonvml.Return) {
		rig.mu.Lock()
		block, entered := rig.block, rig.entered
		rig.mu.Unlock()
		if entered != nil {
			close(entered)
		}
		if block != nil {
			<-block
		}
		if !valid("GetActiveVgpus") {
			return nil, gonvml.ERROR_UNINITIALIZED
		}
		rig.j.add(fmt.Sprintf("GetActiveVgpus %d", n))
		return make([]gonvml.VgpuInstance, n), gonvml.SUCCESS
	}
	d.GetIndexFunc = func() (int, gonvml.Return) {
		if !valid("GetIndex") {
			return 0, gonvml.ERROR_UNINITIALIZED
		}
		return 0, gonvml.SUCCESS
	}
	d.GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) {
		if !valid("GetPciInfo") {
			return gonvml.PciInfo{}, gonvml.ERROR_UNINITIALIZED
		}
		var info gonvml.PciInfo
		for i, c := range resetPCI {
			info.BusId[i] = int8(c)
		}
		return info, gonvml.SUCCESS
	}
	return d
}

// steps runs the manager's sequence for a MIG mode change on a GPU with
// VFs: release, VFs off, reset, VFs on, and the reopen whatever failed.
func (rig *resetRig) steps(ctx context.Context) (stepErr, reopenErr error) {
	id := resetUUID
	stepErr = rig.r.ReleaseGPU(ctx, id)
	if stepErr == nil {
		stepErr = rig.r.SetVFs(ctx, id, false)
	}
	if stepErr == nil {
		stepErr = rig.r.ResetGPU(ctx, id)
	}
	if verr := rig.r.SetVFs(ctx, id, true); stepErr == nil {
		stepErr = verr
	}
	return stepErr, rig.r.ReopenGPU(ctx, id)
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// The reset shuts NVML down, takes the kernel's steps and initializes it
// again, in that order; the next call looks the GPU up in the new session.
func TestResetSessionOrder(t *testing.T) {
	rig := newResetRig(t, nvmlb.Options{})
	ctx := ctxFor(t, 5*time.Second)
	p := rig.b.Probe(resetUUID)
	if n, err := p.ActiveVGPUCount(ctx); err != nil || n != 1 {
		t.Fatalf("before the reset: %d vGPUs, %v", n, err)
	}
	if err, rerr := rig.steps(ctx); err != nil || rerr != nil {
		t.Fatalf("reset: %v; reopen: %v", err, rerr)
	}
	n, err := p.ActiveVGPUCount(ctx)
	if err != nil || n != 2 {
		t.Fatalf("after the reset: %d vGPUs, %v (want the new session's 2)", n, err)
	}
	want := []string{"Init", "handle 1", "GetActiveVgpus 1", "handle 1", "Shutdown",
		"write sriov_numvfs 0", "write reset 1", "write sriov_numvfs 16", "Init", "handle 2", "handle 2", "GetActiveVgpus 2"}
	if got := rig.j.list(); !slices.Equal(got, want) {
		t.Errorf("journal:\n got %q\nwant %q", got, want)
	}
}

// A call in flight when the reset begins ends before NVML is shut down.
func TestResetWaitsForCallsInFlight(t *testing.T) {
	rig := newResetRig(t, nvmlb.Options{})
	ctx := ctxFor(t, 5*time.Second)
	block, read := rig.heldRead(ctx)
	released := make(chan error, 1)
	go func() { released <- rig.r.ReleaseGPU(ctx, resetUUID) }()
	select {
	case err := <-released:
		t.Fatalf("the session was released under a call in flight (%v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	if slices.Contains(rig.j.list(), "Shutdown") {
		t.Fatal("NVML shut down under a call in flight")
	}
	close(block)
	if err := <-read; err != nil {
		t.Fatalf("the call in flight: %v", err)
	}
	if err := <-released; err != nil {
		t.Fatalf("release: %v", err)
	}
	got := rig.j.list()
	if i, k := slices.Index(got, "GetActiveVgpus 1"), slices.Index(got, "Shutdown"); i < 0 || k < i {
		t.Errorf("journal %q: the call in flight must end before Shutdown", got)
	}
	if err := rig.r.ReopenGPU(ctx, resetUUID); err != nil {
		t.Fatal(err)
	}
}

// A call made while the session is released waits, and runs after Init
// with the new session's handle.
func TestResetHoldsNewCalls(t *testing.T) {
	rig := newResetRig(t, nvmlb.Options{})
	ctx := ctxFor(t, 5*time.Second)
	p := rig.b.Probe(resetUUID)
	if _, err := p.ActiveVGPUCount(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rig.r.ReleaseGPU(ctx, resetUUID); err != nil {
		t.Fatal(err)
	}
	type res struct {
		n   int
		err error
	}
	read := make(chan res, 1)
	go func() {
		n, err := p.ActiveVGPUCount(ctx)
		read <- res{n, err}
	}()
	select {
	case r := <-read:
		t.Fatalf("a call ran while the session was released: %d, %v", r.n, r.err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := rig.r.SetVFs(ctx, resetUUID, false); err != nil {
		t.Fatal(err)
	}
	if err := rig.r.ResetGPU(ctx, resetUUID); err != nil {
		t.Fatal(err)
	}
	if err := rig.r.SetVFs(ctx, resetUUID, true); err != nil {
		t.Fatal(err)
	}
	if err := rig.r.ReopenGPU(ctx, resetUUID); err != nil {
		t.Fatal(err)
	}
	r := <-read
	if r.err != nil || r.n != 2 {
		t.Fatalf("the held call: %d vGPUs, %v (want the new session's 2)", r.n, r.err)
	}
}

// A call whose deadline passes while the session is released gets
// gpu.ErrResetting and never reaches the driver.
func TestResetOutlastsCallDeadline(t *testing.T) {
	rig := newResetRig(t, nvmlb.Options{})
	ctx := ctxFor(t, 5*time.Second)
	if err := rig.r.ReleaseGPU(ctx, resetUUID); err != nil {
		t.Fatal(err)
	}
	before := len(rig.j.list())
	_, err := rig.b.Probe(resetUUID).ActiveVGPUCount(ctxFor(t, 30*time.Millisecond))
	if !errors.Is(err, gpu.ErrResetting) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), resetUUID) {
		t.Fatalf("a call outlasted by the reset: %v (want gpu.ErrResetting naming %s)", err, resetUUID)
	}
	if got := rig.j.list(); len(got) != before {
		t.Errorf("the driver saw %q while the session was released", got[before:])
	}
	if err := rig.r.ReopenGPU(ctx, resetUUID); err != nil {
		t.Fatal(err)
	}
}

// A kernel step that fails leaves the rest to run: the VFs come back, NVML
// is initialized again and the gate opens; the error names the step.
func TestResetFailedStepReopens(t *testing.T) {
	rig := newResetRig(t, nvmlb.Options{})
	ctx := ctxFor(t, 5*time.Second)
	rig.sys.fail["reset"] = syscall.EBUSY
	err, rerr := rig.steps(ctx)
	if !errors.Is(err, sysfs.ErrResetRefused) || !strings.Contains(err.Error(), "reset") {
		t.Fatalf("failed reset: %v (want the kernel's refusal of the reset step)", err)
	}
	if rerr != nil {
		t.Fatalf("reopen after a failed reset: %v", rerr)
	}
	want := []string{"Init", "handle 1", "Shutdown", "write sriov_numvfs 0", "write reset 1", "write sriov_numvfs 16", "Init", "handle 2"}
	if got := rig.j.list(); !slices.Equal(got, want) {
		t.Errorf("journal:\n got %q\nwant %q", got, want)
	}
	if n, err := rig.b.Probe(resetUUID).ActiveVGPUCount(ctxFor(t, time.Second)); err != nil || n != 2 {
		t.Fatalf("after a failed reset: %d vGPUs, %v (want the new session's 2)", n, err)
	}
}

// An Init that keeps failing after the reset still reopens the gate: the
// calls then get the driver's answer, not a wait.
func TestResetInitFailsReopens(t *testing.T) {
	rig := newResetRig(t, nvmlb.Options{ReopenTimeout: 100 * time.Millisecond})
	ctx := ctxFor(t, time.Minute)
	if err := rig.r.ReleaseGPU(ctx, resetUUID); err != nil {
		t.Fatal(err)
	}
	rig.mu.Lock()
	rig.initErr = gonvml.ERROR_DRIVER_NOT_LOADED
	rig.mu.Unlock()
	// Ended: the reopen must not depend on the caller's context.
	dead, cancel := context.WithCancel(ctx)
	cancel()
	err := rig.r.ReopenGPU(dead, resetUUID)
	if !errors.Is(err, gpu.ErrDriverNotLoaded) || !strings.Contains(err.Error(), "initialize NVML again") {
		t.Fatalf("reopen with a failing Init: %v", err)
	}
	rig.lib.DeviceGetHandleByUUIDFunc = func(string) (gonvml.Device, gonvml.Return) { return nil, gonvml.ERROR_UNINITIALIZED }
	if _, err := rig.b.Probe(resetUUID).ActiveVGPUCount(ctxFor(t, time.Second)); !errors.Is(err, gpu.ErrDriverNotLoaded) {
		t.Fatalf("a call after the failed reopen: %v (want the driver's answer)", err)
	}
}

// A reset that cannot drain the calls in flight by its deadline gives up
// without shutting NVML down, and the gate opens again.
func TestResetDrainDeadline(t *testing.T) {
	rig := newResetRig(t, nvmlb.Options{})
	ctx := ctxFor(t, 5*time.Second)
	block, read := rig.heldRead(ctx)
	err := rig.r.ReleaseGPU(ctxFor(t, 300*time.Millisecond), resetUUID)
	if !errors.Is(err, gpu.ErrTimeout) || !strings.Contains(err.Error(), "in flight") {
		t.Fatalf("release under a stuck call: %v", err)
	}
	close(block)
	if err := <-read; err != nil {
		t.Fatal(err)
	}
	if slices.Contains(rig.j.list(), "Shutdown") {
		t.Error("NVML shut down although the release gave up")
	}
	if n, err := rig.b.Probe(resetUUID).ActiveVGPUCount(ctxFor(t, time.Second)); err != nil || n != 1 {
		t.Fatalf("after the release gave up: %d vGPUs, %v (want the same session's 1)", n, err)
	}
	// The manager reopens after any failed step: a no-op here.
	if err := rig.r.ReopenGPU(ctx, resetUUID); err != nil || slices.Contains(rig.j.list()[1:], "Init") {
		t.Fatalf("reopen after a failed release: %v, journal %q", err, rig.j.list())
	}
}

// The reset itself is refused while vgpud's session is open: the kernel
// would refuse it, and nothing is written.
func TestResetNeedsReleasedSession(t *testing.T) {
	rig := newResetRig(t, nvmlb.Options{})
	rig.sys.files["sriov_numvfs"] = "0\n"
	err := rig.r.ResetGPU(ctxFor(t, time.Second), resetUUID)
	if !errors.Is(err, gpu.ErrInUse) {
		t.Fatalf("reset with the session open: %v (want gpu.ErrInUse)", err)
	}
	for _, op := range rig.j.list() {
		if strings.HasPrefix(op, "write") {
			t.Errorf("%s with the session open", op)
		}
	}
}

// Event watching lets go of the session when a reset wants it.
func TestResetEndsEventWatch(t *testing.T) {
	rig := newResetRig(t, nvmlb.Options{})
	ctx := ctxFor(t, 5*time.Second)
	waiting := make(chan struct{})
	var once sync.Once
	set := &mock.EventSet{
		WaitFunc: func(uint32) (gonvml.EventData, gonvml.Return) {
			once.Do(func() { close(waiting) })
			time.Sleep(time.Millisecond)
			return gonvml.EventData{}, gonvml.ERROR_TIMEOUT
		},
	}
	freed := make(chan struct{})
	set.FreeFunc = func() gonvml.Return {
		rig.j.add("Free")
		close(freed)
		return gonvml.SUCCESS
	}
	dev := rig.device(1)
	dev.GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) { return nvmlb.WatchedEvents, gonvml.SUCCESS }
	dev.RegisterEventsFunc = func(uint64, gonvml.EventSet) gonvml.Return { return gonvml.SUCCESS }
	dev.GetUUIDFunc = func() (string, gonvml.Return) { return resetUUID, gonvml.SUCCESS }
	rig.lib.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return set, gonvml.SUCCESS }
	rig.lib.DeviceGetCountFunc = func() (int, gonvml.Return) { return 1, gonvml.SUCCESS }
	rig.lib.DeviceGetHandleByIndexFunc = func(int) (gonvml.Device, gonvml.Return) { return dev, gonvml.SUCCESS }
	watched := make(chan error, 1)
	go func() { watched <- rig.b.WatchEvents(ctx, func(nvmlb.Event) {}) }()
	<-waiting
	if err := rig.r.ReleaseGPU(ctx, resetUUID); err != nil {
		t.Fatal(err)
	}
	if err := <-watched; !errors.Is(err, gpu.ErrResetting) {
		t.Fatalf("event watch during a reset: %v (want gpu.ErrResetting)", err)
	}
	<-freed
	got := rig.j.list()
	if i, k := slices.Index(got, "Free"), slices.Index(got, "Shutdown"); i < 0 || k < i {
		t.Errorf("journal %q: the event set must be freed before Shutdown", got)
	}
	if err := rig.r.ReopenGPU(ctx, resetUUID); err != nil {
		t.Fatal(err)
	}
}
