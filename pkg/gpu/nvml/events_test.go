package nvml_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

// watchSim starts WatchEvents over a fresh simulated host and returns once
// every GPU is registered (the Observer sees each RegisterEvents call).
func watchSim(t *testing.T) (*sim.Host, <-chan nvmlb.Event, map[string]string) {
	t.Helper()
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	h, err := sim.Open(t.TempDir(), nil, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	gpus, err := h.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	uuids := map[string]string{}
	for _, g := range gpus {
		uuids[g[0]] = g[1]
	}
	var registered atomic.Int32
	ready := make(chan struct{})
	b := nvmlb.New(h.NVML(), cat, nvmlb.Options{Observer: func(op string, _ time.Duration, ret gonvml.Return) {
		if op == "RegisterEvents" && ret == gonvml.SUCCESS && int(registered.Add(1)) == len(gpus) {
			close(ready)
		}
	}})
	ctx, cancel := context.WithCancel(context.Background())
	if err := b.Init(ctx); err != nil {
		t.Fatal(err)
	}
	events := make(chan nvmlb.Event, 16)
	done := make(chan error, 1)
	go func() { done <- b.WatchEvents(ctx, func(e nvmlb.Event) { events <- e }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("WatchEvents: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("WatchEvents did not stop")
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("WatchEvents: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("GPUs not registered")
	}
	return h, events, uuids
}

func TestWatchEventsSimulated(t *testing.T) {
	const h100, l4 = sim.DefaultH100MIG, sim.DefaultL4
	tests := []struct {
		name   string
		inject func(h *sim.Host) error
		gpu    string
		want   nvmlb.Event
	}{
		{name: "double-bit-ecc-xid", inject: func(h *sim.Host) error { return h.InjectXID(h100, 48, -1) },
			gpu: h100, want: nvmlb.Event{Type: gonvml.EventTypeXidCriticalError, XID: 48, GPUInstance: -1, ComputeInstance: -1}},
		{name: "contained-ecc-scoped-to-gpu-instance", inject: func(h *sim.Host) error { return h.InjectXID(h100, 94, 3) },
			gpu: h100, want: nvmlb.Event{Type: gonvml.EventTypeXidCriticalError, XID: 94, GPUInstance: 3, ComputeInstance: -1}},
		// The lost GPU answers nothing; it is the one registered GPU that
		// is lost, so the event still names it.
		{name: "fell-off-the-bus", inject: func(h *sim.Host) error { return h.LoseGPU(l4) },
			gpu: l4, want: nvmlb.Event{Type: gonvml.EventTypeXidCriticalError, XID: 79, GPUInstance: -1, ComputeInstance: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, events, uuids := watchSim(t)
			if err := tt.inject(h); err != nil {
				t.Fatal(err)
			}
			select {
			case got := <-events:
				want := tt.want
				want.GPU, want.PCI, want.Time = uuids[tt.gpu], tt.gpu, got.Time
				if got != want {
					t.Fatalf("event\n got %+v\nwant %+v", got, want)
				}
				if !got.IsXID() {
					t.Fatal("IsXID false")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("no event")
			}
		})
	}
}

// fakeLib is an NVML with scripted devices and Wait results.
type fakeLib struct {
	lib   *mock.Interface
	freed atomic.Bool
	// onWait runs before every Wait.
	onWait func()
}

type waitResult struct {
	data gonvml.EventData
	ret  gonvml.Return
}

func newFakeLib(devs []*mock.Device, script []waitResult) *fakeLib {
	f := &fakeLib{}
	var mu sync.Mutex
	set := &mock.EventSet{
		WaitFunc: func(ms uint32) (gonvml.EventData, gonvml.Return) {
			if f.onWait != nil {
				f.onWait()
			}
			mu.Lock()
			defer mu.Unlock()
			if len(script) == 0 {
				time.Sleep(time.Duration(ms) * time.Millisecond)
				return gonvml.EventData{}, gonvml.ERROR_TIMEOUT
			}
			r := script[0]
			script = script[1:]
			return r.data, r.ret
		},
		FreeFunc: func() gonvml.Return { f.freed.Store(true); return gonvml.SUCCESS },
	}
	f.lib = &mock.Interface{
		EventSetCreateFunc: func() (gonvml.EventSet, gonvml.Return) { return set, gonvml.SUCCESS },
		DeviceGetCountFunc: func() (int, gonvml.Return) { return len(devs), gonvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (gonvml.Device, gonvml.Return) {
			return devs[i], gonvml.SUCCESS
		},
	}
	return f
}

func fakeDevice(uuid string, supported uint64, lost *atomic.Bool) *mock.Device {
	return &mock.Device{
		GetUUIDFunc: func() (string, gonvml.Return) {
			if lost != nil && lost.Load() {
				return "", gonvml.ERROR_GPU_IS_LOST
			}
			return uuid, gonvml.SUCCESS
		},
		GetPciInfoFunc: func() (gonvml.PciInfo, gonvml.Return) {
			var p gonvml.PciInfo
			copy(p.BusId[:], []int8{'0', '0', '0', '0', '0', '0', '0', '0', ':', '4', '1', ':', '0', '0', '.', '0'})
			return p, gonvml.SUCCESS
		},
		GetSupportedEventTypesFunc: func() (uint64, gonvml.Return) {
			if supported == 0 {
				return 0, gonvml.ERROR_NOT_SUPPORTED
			}
			return supported, gonvml.SUCCESS
		},
		RegisterEventsFunc: func(mask uint64, _ gonvml.EventSet) gonvml.Return {
			if mask&^supported != 0 {
				return gonvml.ERROR_NOT_SUPPORTED
			}
			return gonvml.SUCCESS
		},
	}
}

func TestWatchEventsScripted(t *testing.T) {
	lostFlag := &atomic.Bool{}
	lost := fakeDevice("GPU-lost", gonvml.EventTypeXidCriticalError, lostFlag)
	ok := fakeDevice("GPU-ok", gonvml.EventTypeXidCriticalError|gonvml.EventTypeClock, nil)
	repeat := func(r waitResult, n int) []waitResult {
		var out []waitResult
		for i := 0; i < n; i++ {
			out = append(out, r)
		}
		return out
	}
	tests := []struct {
		name        string
		devs        []*mock.Device
		script      []waitResult
		lose        bool
		lostAtStart bool
		wantErr     error
		wantEvents  []string
	}{
		{name: "no-gpu-supports-events", devs: []*mock.Device{fakeDevice("GPU-old", 0, nil)}, wantErr: gpu.ErrNotSupported},
		{name: "driver-went-away", devs: []*mock.Device{ok}, script: []waitResult{{ret: gonvml.ERROR_UNINITIALIZED}},
			wantErr: gpu.ErrDriverNotLoaded},
		{name: "events-then-timeouts", devs: []*mock.Device{fakeDevice("GPU-old", 0, nil), ok},
			script: []waitResult{
				{ret: gonvml.ERROR_TIMEOUT},
				{data: gonvml.EventData{Device: ok, EventType: gonvml.EventTypeXidCriticalError, EventData: 13, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}},
			},
			wantEvents: []string{"GPU-ok/13"}},
		// A driver that keeps answering GPU_IS_LOST: reported once, then
		// WatchEvents gives up so its caller starts over.
		{name: "repeated-gpu-is-lost", devs: []*mock.Device{lost, ok}, lose: true,
			script:     repeat(waitResult{data: gonvml.EventData{EventType: gonvml.EventTypeXidCriticalError, EventData: 79}, ret: gonvml.ERROR_GPU_IS_LOST}, 12),
			wantErr:    gonvml.ERROR_GPU_IS_LOST,
			wantEvents: []string{"GPU-lost/79/lost"}},
		// Lost before it could be registered: reported once, unnamed.
		{name: "lost-before-registration", devs: []*mock.Device{lost, ok}, lostAtStart: true,
			script:     []waitResult{{data: gonvml.EventData{Device: ok, EventType: gonvml.EventTypeXidCriticalError, EventData: 31}}},
			wantEvents: []string{"/0/lost", "GPU-ok/31"}},
		{name: "persistent-unknown-error", devs: []*mock.Device{ok}, script: repeat(waitResult{ret: gonvml.ERROR_UNKNOWN}, 10),
			wantErr: gonvml.ERROR_UNKNOWN},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lostFlag.Store(tt.lostAtStart)
			f := newFakeLib(tt.devs, tt.script)
			if tt.lose {
				// Lost after registration, as a GPU falls off the bus.
				f.onWait = func() { lostFlag.Store(true) }
			}
			b := nvmlb.New(f.lib, nil, nvmlb.Options{})
			var got []string
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stopAfter := len(tt.wantEvents)
			err := b.WatchEvents(ctx, func(e nvmlb.Event) {
				s := e.GPU + "/" + itoa(e.XID)
				if e.Lost {
					s += "/lost"
				}
				got = append(got, s)
				if tt.wantErr == nil && len(got) == stopAfter {
					cancel()
				}
			})
			if tt.wantErr == nil && err != nil || tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("WatchEvents: %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr == nil && ctx.Err() == nil {
				t.Fatal("returned before its context ended")
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.wantEvents) {
				t.Fatalf("events %v, want %v", got, tt.wantEvents)
			}
			if !errors.Is(tt.wantErr, gpu.ErrNotSupported) && !f.freed.Load() {
				t.Fatal("event set not freed")
			}
		})
	}
}

func TestWatchEventsStopsPromptly(t *testing.T) {
	f := newFakeLib([]*mock.Device{fakeDevice("GPU-ok", gonvml.EventTypeXidCriticalError, nil)}, nil)
	waiting := make(chan struct{})
	var once sync.Once
	f.onWait = func() { once.Do(func() { close(waiting) }) }
	b := nvmlb.New(f.lib, nil, nvmlb.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.WatchEvents(ctx, func(nvmlb.Event) {}) }()
	<-waiting
	cancel()
	start := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WatchEvents: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WatchEvents did not stop")
	}
	// Stopping waits out at most the Wait in progress (500ms); a generous
	// bound, so that only a watcher that ignores its context fails.
	if took := time.Since(start); took > 4*time.Second {
		t.Fatalf("stop took %v, want about one Wait (500ms)", took)
	}
	if !f.freed.Load() {
		t.Fatal("event set not freed")
	}
}

func itoa(n uint64) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}
