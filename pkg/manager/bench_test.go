package manager_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// bigHost is 12 H200s with 32 SR-IOV VFs each: 384 vGPUs of H200X-4C
// (32 per GPU, the VF count) is the most the simulated driver admits on
// this many GPUs.
func bigHost(n int) *sim.Spec {
	s := &sim.Spec{Version: "v1"}
	for i := 0; i < n; i++ {
		s.GPUs = append(s.GPUs, sim.GPUSpec{Model: "H200-SXM5-141GB", PCI: fmt.Sprintf("0000:%02x:00.0", 0x10+0x10*i), Flavour: gpu.FlavourVFIO})
	}
	return s
}

func fill(b *testing.B, e *env, gpus, per int) {
	e.tenant("bench", unlimited())
	for i := 0; i < gpus*per; i++ {
		if _, err := e.create("bench", "H200X-4C", ""); err != nil {
			b.Fatalf("instance %d: %v", i, err)
		}
	}
}

// BenchmarkReconcile384 is reconcile at start on a host whose 384
// instances are all present (the daemon restarted).
func BenchmarkReconcile384(b *testing.B) {
	e := newEnv(b, bigHost(12))
	fill(b, e, 12, 32)
	b.ResetTimer()
	for b.Loop() {
		rep, err := e.m.Reconcile(context.Background())
		if err != nil || len(rep.Recreated) != 0 {
			b.Fatalf("%+v, %v", rep, err)
		}
	}
}

// BenchmarkReconcileAfterReboot384 re-creates 384 instances a host reboot lost.
func BenchmarkReconcileAfterReboot384(b *testing.B) {
	e := newEnv(b, bigHost(12))
	fill(b, e, 12, 32)
	for b.Loop() {
		b.StopTimer()
		if err := e.sim.Reboot(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		rep, err := e.m.Reconcile(context.Background())
		if err != nil || len(rep.Recreated) != 384 {
			b.Fatalf("recreated %d, %v", len(rep.Recreated), err)
		}
	}
}
