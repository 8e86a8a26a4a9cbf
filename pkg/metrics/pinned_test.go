package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/metrics"
	"github.com/vgpud/vgpud/pkg/share"
)

type fixedSnapshot struct{ s *share.Snapshot }

func (f fixedSnapshot) Snapshot() *share.Snapshot { return f.s }

// A GPU whose scheduler an operator pinned shows mode="pinned" and the
// pinned policy as the desired one, pending while the driver refuses it.
func TestPinnedSchedulerMetrics(t *testing.T) {
	src := share.SourceFunc(func(context.Context) (share.Inventory, error) { return share.Inventory{}, nil })
	snap := &share.Snapshot{Mode: share.Adaptive, Windows: 1, Window: time.Second, GPUs: []share.GPUShares{
		{UUID: "GPU-pinned", Supported: true, Policy: share.BestEffort, Desired: share.FixedShare, Pinned: true, Pending: &share.Pending{To: share.FixedShare}},
		{UUID: "GPU-loop", Supported: true, Policy: share.BestEffort, Desired: share.BestEffort},
	}}
	c, err := metrics.New(metrics.Config{Source: src, Shares: fixedSnapshot{snap}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	mfs := parse(t, scrape(t, c))
	if v, ok := value(mfs, "vgpud_gpu_scheduler_policy_info", map[string]string{"UUID": "GPU-pinned", "policy": "best_effort", "desired": "fixed_share", "mode": "pinned"}); !ok || v != 1 {
		t.Errorf("pinned GPU's policy_info missing or %v", v)
	}
	if v, _ := value(mfs, "vgpud_gpu_scheduler_policy_pending", map[string]string{"UUID": "GPU-pinned"}); v != 1 {
		t.Errorf("pinned GPU's policy_pending %v, want 1", v)
	}
	if _, ok := value(mfs, "vgpud_gpu_scheduler_policy_info", map[string]string{"UUID": "GPU-loop", "mode": "adaptive"}); !ok {
		t.Error("the loop's GPU lost its mode label")
	}
}
