package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/metrics"
	"github.com/vgpud/vgpud/pkg/share"
)

// GPU instance schedulers (Blackwell GB20x) carry GPU_I_ID, as
// dcgm-exporter's MIG series do: a pinned one its policy, time slice and
// pending state, one not pinned only its mode.
func TestGPUInstanceSchedulerMetrics(t *testing.T) {
	src := share.SourceFunc(func(context.Context) (share.Inventory, error) {
		return share.Inventory{GPUs: []share.GPU{{UUID: "GPU-rtx", PCI: "0000:c1:00.0", Model: "RTX-PRO-6000-BSE-96GB", MIG: true, GPUInstanceSchedulers: []share.GPUInstanceScheduler{
			{GI: 3, Profile: "1g.24gb+gfx", Pinned: true, Policy: share.EqualShare, Timeslice: 5 * time.Millisecond, Pending: true},
			{GI: 5, Profile: "1g.24gb+gfx"},
		}}}}, nil
	})
	c, err := metrics.New(metrics.Config{Source: src})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	mfs := parse(t, scrape(t, c))
	if v, ok := value(mfs, "vgpud_gpu_instance_scheduler_info", map[string]string{"UUID": "GPU-rtx", "GPU_I_ID": "3", "GPU_I_PROFILE": "1g.24gb+gfx", "mode": "pinned", "policy": "equal_share"}); !ok || v != 1 {
		t.Errorf("pinned GPU instance's info missing or %v", v)
	}
	if v, _ := value(mfs, "vgpud_gpu_instance_scheduler_timeslice_seconds", map[string]string{"UUID": "GPU-rtx", "GPU_I_ID": "3"}); v != 0.005 {
		t.Errorf("time slice %v, want 0.005", v)
	}
	if v, _ := value(mfs, "vgpud_gpu_instance_scheduler_pending", map[string]string{"UUID": "GPU-rtx", "GPU_I_ID": "3"}); v != 1 {
		t.Errorf("pending %v, want 1", v)
	}
	if _, ok := value(mfs, "vgpud_gpu_instance_scheduler_info", map[string]string{"UUID": "GPU-rtx", "GPU_I_ID": "5", "mode": "adaptive"}); !ok {
		t.Error("the unpinned GPU instance's info is missing")
	}
	if _, ok := value(mfs, "vgpud_gpu_instance_scheduler_pending", map[string]string{"GPU_I_ID": "5"}); ok {
		t.Error("an unpinned GPU instance has a pending series")
	}
}
