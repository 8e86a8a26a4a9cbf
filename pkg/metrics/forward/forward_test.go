package forward_test

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/metrics"
	"github.com/vgpud/vgpud/pkg/metrics/forward"
	"github.com/vgpud/vgpud/pkg/share"
)

// noDriver is a share loop driver for a loop that never runs.
type noDriver struct{}

func (noDriver) GPU(string) share.GPUDriver { return nil }

// Every operation's duration reaches the histogram, not only creates'.
func TestForwardEventsDurations(t *testing.T) {
	src := share.SourceFunc(func(context.Context) (share.Inventory, error) { return share.Inventory{}, nil })
	col, err := metrics.New(metrics.Config{Source: src})
	if err != nil {
		t.Fatal(err)
	}
	loop, err := share.New(src, noDriver{}, share.Config{Mode: share.Observe})
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan manager.Event, 8)
	for _, e := range []manager.Event{
		{Kind: manager.EventOperationDone, Op: "create", Took: 2 * time.Second},
		{Kind: manager.EventOperationDone, Op: "attach", Took: 300 * time.Millisecond},
		{Kind: manager.EventOperationFailed, Op: "detach", Took: 40 * time.Millisecond},
		{Kind: manager.EventOperationDone, Op: "destroy", Took: 700 * time.Millisecond},
	} {
		events <- e
	}
	close(events)
	forward.Events(context.Background(), events, col, loop, share.NewCache(src, time.Minute), slog.New(slog.DiscardHandler))
	if err := col.Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	col.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		`vgpud_operation_duration_seconds_sum{op="create",outcome="success"} 2`,
		`vgpud_operation_duration_seconds_sum{op="attach",outcome="success"} 0.3`,
		`vgpud_operation_duration_seconds_sum{op="detach",outcome="failure"} 0.04`,
		`vgpud_operation_duration_seconds_sum{op="destroy",outcome="success"} 0.7`,
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("exposition lacks %s", want)
		}
	}
}

// A setting the driver lost and vgpud set again is counted by setting and
// by the pass that found it, and as a drift of kind settings; the series
// exist at 0 before the first.
func TestForwardSettingsRestored(t *testing.T) {
	src := share.SourceFunc(func(context.Context) (share.Inventory, error) { return share.Inventory{}, nil })
	col, err := metrics.New(metrics.Config{Source: src})
	if err != nil {
		t.Fatal(err)
	}
	loop, err := share.New(src, noDriver{}, share.Config{Mode: share.Observe})
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan manager.Event, 8)
	events <- manager.Event{Kind: manager.EventDrift, Op: manager.DriftSettings, ID: "GPU-l4", Setting: manager.SettingHeterogeneous, Cause: manager.CauseDrift}
	events <- manager.Event{Kind: manager.EventDrift, Op: manager.DriftSettings, ID: "GPU-l4", Setting: manager.SettingScheduler, Cause: manager.CauseDrift}
	events <- manager.Event{Kind: manager.EventDrift, Op: manager.DriftSettings, ID: "GPU-l4", Setting: manager.SettingScheduler, Cause: manager.CauseReconcile}
	close(events)
	forward.Events(context.Background(), events, col, loop, share.NewCache(src, time.Minute), slog.New(slog.DiscardHandler))
	if err := col.Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	col.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		`vgpud_settings_restored_total{event="drift",setting="heterogeneous"} 1`,
		`vgpud_settings_restored_total{event="drift",setting="scheduler"} 1`,
		`vgpud_settings_restored_total{event="reconcile",setting="scheduler"} 1`,
		`vgpud_settings_restored_total{event="reconcile",setting="heterogeneous"} 0`,
		`vgpud_drift_events_total{kind="settings"} 3`,
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("exposition lacks %s", want)
		}
	}
}
