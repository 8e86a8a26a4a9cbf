package nvml_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
)

// late is how long a slow fake NVML call takes: well past callDeadline.
const (
	late         = 200 * time.Millisecond
	callDeadline = 20 * time.Millisecond
)

// observed records what the Observer was told.
type observed struct {
	mu   sync.Mutex
	rets map[string]gonvml.Return
}

func (o *observed) observe(op string, _ time.Duration, ret gonvml.Return) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.rets[op] = ret
}

func (o *observed) ret(op string) gonvml.Return {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.rets[op]
}

// fakeBackend is a Backend over lib whose GPU "GPU-fake" is dev.
func fakeBackend(lib *mock.Interface, dev *mock.Device) (*nvmlb.Backend, *observed) {
	lib.DeviceGetHandleByUUIDFunc = func(uuid string) (gonvml.Device, gonvml.Return) {
		if uuid != "GPU-fake" {
			return nil, gonvml.ERROR_NOT_FOUND
		}
		return dev, gonvml.SUCCESS
	}
	o := &observed{rets: map[string]gonvml.Return{}}
	return nvmlb.New(lib, nil, nvmlb.Options{Observer: o.observe}), o
}

// A driver call that outruns its deadline fails with gpu.ErrTimeout and
// runs on; what it returns then must not land in memory the caller reads
// (go test -race fails otherwise).
func TestAbandonedCallsDoNotRace(t *testing.T) {
	slow := func() { time.Sleep(late) }
	tests := []struct {
		name string
		op   string
		lib  func(*mock.Interface, *mock.Device)
		read func(context.Context, *nvmlb.Backend) (any, error)
	}{
		{
			name: "probe-clocks", op: "GetCurrentClocksEventReasons",
			lib: func(_ *mock.Interface, d *mock.Device) {
				d.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) { slow(); return 4, gonvml.SUCCESS }
			},
			read: func(ctx context.Context, b *nvmlb.Backend) (any, error) { return b.Probe("GPU-fake").Clocks(ctx) },
		},
		{
			name: "probe-telemetry", op: "GetMaxClockInfo",
			lib: func(l *mock.Interface, d *mock.Device) {
				// A driver without nvmlDeviceGetTemperatureV: the temperature is
				// skipped as unsupported, and the read goes on.
				l.ExtensionsFunc = func() gonvml.ExtendedInterface { return lacking("nvmlDeviceGetTemperatureV") }
				d.GetUtilizationRatesFunc = func() (gonvml.Utilization, gonvml.Return) { return gonvml.Utilization{Gpu: 50}, gonvml.SUCCESS }
				d.GetPowerUsageFunc = func() (uint32, gonvml.Return) { return 100000, gonvml.SUCCESS }
				d.GetTotalEnergyConsumptionFunc = func() (uint64, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
				d.GetEnforcedPowerLimitFunc = func() (uint32, gonvml.Return) { return 300000, gonvml.SUCCESS }
				d.GetMaxClockInfoFunc = func(gonvml.ClockType) (uint32, gonvml.Return) { slow(); return 1980, gonvml.SUCCESS }
			},
			read: func(ctx context.Context, b *nvmlb.Backend) (any, error) {
				return b.Probe("GPU-fake").Telemetry(ctx, true)
			},
		},
		{
			name: "backend-driver", op: "SystemGetDriverVersion",
			lib: func(l *mock.Interface, _ *mock.Device) {
				l.SystemGetDriverVersionFunc = func() (string, gonvml.Return) { slow(); return "580.65", gonvml.SUCCESS }
			},
			read: func(ctx context.Context, b *nvmlb.Backend) (any, error) { return b.Driver(ctx) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lib, dev := &mock.Interface{}, &mock.Device{}
			tt.lib(lib, dev)
			b, o := fakeBackend(lib, dev)
			ctx, cancel := context.WithTimeout(context.Background(), callDeadline)
			defer cancel()
			got, err := tt.read(ctx, b)
			if !errors.Is(err, gpu.ErrTimeout) {
				t.Fatalf("err = %v, want gpu.ErrTimeout", err)
			}
			if ret := o.ret(tt.op); ret != gonvml.ERROR_TIMEOUT {
				t.Errorf("observed %s: %v, want ERROR_TIMEOUT", tt.op, ret)
			}
			// Let the abandoned call return while the caller holds got.
			if err := b.Quiesce(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Logf("after a timeout: %+v", got)
		})
	}
}

// sample is a fake GPM sample: GpmMigSampleGet writes it, GpmMetricsGet
// reads it, as the driver does.
type sample struct {
	mock.GpmSample
	taken int
}

// A GpmMetricsGet abandoned at its deadline may still write into its
// argument and read its two samples: MIGActivity must not use any of them
// again, and reuses its metrics buffer otherwise.
func TestMIGActivityAfterAbandonedMetrics(t *testing.T) {
	var (
		mu      sync.Mutex
		slow    bool // GpmMetricsGet takes late
		buffers []*gonvml.GpmMetricsGetType
	)
	dev := &mock.Device{}
	lib := &mock.Interface{
		GpmQueryDeviceSupportFunc: func(gonvml.Device) (gonvml.GpmSupport, gonvml.Return) {
			return gonvml.GpmSupport{IsSupportedDevice: 1}, gonvml.SUCCESS
		},
		GpmSampleAllocFunc: func() (gonvml.GpmSample, gonvml.Return) { return &sample{}, gonvml.SUCCESS },
		GpmMigSampleGetFunc: func(_ gonvml.Device, _ int, s gonvml.GpmSample) gonvml.Return {
			s.(*sample).taken++
			return gonvml.SUCCESS
		},
		GpmMetricsGetFunc: func(m *gonvml.GpmMetricsGetType) gonvml.Return {
			mu.Lock()
			wait := slow
			buffers = append(buffers, m)
			mu.Unlock()
			if wait {
				time.Sleep(late)
			}
			busy := float64(m.Sample1.(*sample).taken + m.Sample2.(*sample).taken)
			m.Metrics[0].Value, m.Metrics[0].NvmlReturn = busy, uint32(gonvml.SUCCESS)
			m.Metrics[1].Value, m.Metrics[1].NvmlReturn = busy, uint32(gonvml.SUCCESS)
			return gonvml.SUCCESS
		},
	}
	b, _ := fakeBackend(lib, dev)
	p := b.Probe("GPU-fake")
	bg := context.Background()
	activity := func(ctx context.Context) (map[int]nvmlb.MIGActivity, error) { return p.MIGActivity(ctx, []int{1}) }
	if _, err := activity(bg); err != nil { // first sample
		t.Fatal(err)
	}
	if a, err := activity(bg); err != nil || a[1].SM == 0 {
		t.Fatalf("second sample: %v, %v", a, err)
	}

	mu.Lock()
	slow = true
	mu.Unlock()
	ctx, cancel := context.WithTimeout(bg, callDeadline)
	defer cancel()
	if _, err := activity(ctx); !errors.Is(err, gpu.ErrTimeout) {
		t.Fatalf("err = %v, want gpu.ErrTimeout", err)
	}
	mu.Lock()
	slow = false
	mu.Unlock()

	// While the abandoned call sleeps on, before it reads its samples and
	// writes its buffer.
	for i := 0; i < 3; i++ {
		if _, err := activity(bg); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Quiesce(bg); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	// Calls 2 and 3 (abandoned) share a buffer; after it, the first call
	// resamples, and the next two share a fresh one.
	if len(buffers) != 4 {
		t.Fatalf("%d GpmMetricsGet calls, want 4", len(buffers))
	}
	if buffers[0] != buffers[1] {
		t.Errorf("the buffer was not reused between calls that returned in time")
	}
	if buffers[2] == buffers[1] {
		t.Errorf("the buffer of the abandoned call was reused")
	}
	if buffers[3] != buffers[2] {
		t.Errorf("the fresh buffer was not reused")
	}
}
