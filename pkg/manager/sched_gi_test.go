package manager_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
)

const rtxPro = "0000:c1:00.0"

func rtxProSpec() *sim.Spec {
	return &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{
		{Model: "RTX-PRO-6000-BSE-96GB", PCI: rtxPro, Flavour: gpu.FlavourVFIO, MIG: true},
		{Model: "H100-SXM5-80GB", PCI: sim.DefaultH100MIG, Flavour: gpu.FlavourVFIO, MIG: true},
		{Model: "L4-24GB", PCI: sim.DefaultL4, Flavour: gpu.FlavourVFIO},
	}}
}

// giView is the scheduler of GPU instance gi of the RTX PRO 6000 as the
// GPU view shows it.
func giView(t *testing.T, e *env, gi int) manager.GPUInstanceSchedulerView {
	t.Helper()
	g, err := e.m.GPU(rtxPro)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range g.GPUInstanceSchedulers {
		if v.GPUInstance == gi {
			return v
		}
	}
	t.Fatalf("GPU view has no scheduler of GPU instance %d: %+v", gi, g.GPUInstanceSchedulers)
	return manager.GPUInstanceSchedulerView{}
}

// The per-GPU-instance scheduler of a Blackwell GB20x GPU: bad requests
// are refused by name and change nothing; a pin while a VM runs in the
// GPU instance is pending until it stops; the pin comes back after a
// driver reload and after a reboot that re-creates the GPU instance.
func TestGPUInstanceSchedulerPinPendingAndRecreate(t *testing.T) {
	e := newEnv(t, rtxProSpec())
	e.tenant("acme", unlimited())
	ctx := context.Background()
	r := e.mustCreate("acme", "RTX Pro 6000 Blackwell DC-1-6Q", rtxPro)
	gi := r.GIID
	g0, _ := e.m.GPU(rtxPro)
	uuid := g0.UUID
	if v := giView(t, e, gi); v.Mode != manager.SchedAdaptive || v.Profile != "1g.24gb+gfx" {
		t.Fatalf("new GPU instance's scheduler: %+v", v)
	}

	pin := manager.SchedulerRequest{Policy: "equal_share", Timeslice: 5 * time.Millisecond}
	h100GI := e.mustCreate("acme", "H100-3g.40gb", sim.DefaultH100MIG).GIID
	for _, c := range []struct {
		name string
		gpu  string
		gi   int
		req  manager.SchedulerRequest
		want error
	}{
		{"no GPU", "", gi, pin, manager.ErrInvalidArgument},
		{"unknown GPU", "0000:ff:00.0", gi, pin, manager.ErrNotFound},
		{"negative GPU instance", rtxPro, -1, pin, manager.ErrInvalidArgument},
		{"no such GPU instance", rtxPro, gi + 40, pin, manager.ErrNotFound},
		{"Hopper", sim.DefaultH100MIG, h100GI, pin, manager.ErrInvalidArgument},
		{"MIG off", sim.DefaultL4, 0, pin, manager.ErrInvalidArgument},
		{"empty request", rtxPro, gi, manager.SchedulerRequest{}, manager.ErrInvalidArgument},
		{"unknown policy", rtxPro, gi, manager.SchedulerRequest{Policy: "round_robin"}, manager.ErrInvalidArgument},
		{"slice out of range", rtxPro, gi, manager.SchedulerRequest{Policy: "equal_share", Timeslice: time.Second}, manager.ErrInvalidArgument},
		{"adaptive with a policy", rtxPro, gi, manager.SchedulerRequest{Mode: manager.SchedAdaptive, Policy: "equal_share"}, manager.ErrInvalidArgument},
	} {
		if _, err := e.m.SetGPUInstanceScheduler(ctx, c.gpu, c.gi, c.req); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if v := giView(t, e, gi); v.Mode != manager.SchedAdaptive {
		t.Fatalf("refused requests changed the view: %+v", v)
	}
	if s, _ := e.host.NVML.GPUInstanceScheduler(ctx, uuid, gi); s.Policy != gpu.SchedBestEffort {
		t.Fatalf("refused requests changed the driver: %+v", s)
	}

	v, err := e.m.SetGPUInstanceScheduler(ctx, rtxPro, gi, pin)
	if err != nil || v.Mode != manager.SchedPinned || v.Pending || v.Timeslice != 5*time.Millisecond {
		t.Fatalf("pin on an idle GPU instance: %+v, %v", v, err)
	}
	if s, _ := e.host.NVML.GPUInstanceScheduler(ctx, uuid, gi); s.Policy != gpu.SchedEqualShare || s.Timeslice != 5*time.Millisecond {
		t.Fatalf("driver holds %+v", s)
	}

	// A VM runs in the GPU instance: the pin waits.
	if err := e.sim.OpenDevice(r.VF, "0b7c1b6e-8d5f-4c4e-9a47-6f7d3f0c2a11", "vm1"); err != nil {
		t.Fatal(err)
	}
	v, err = e.m.SetGPUInstanceScheduler(ctx, rtxPro, gi, manager.SchedulerRequest{Policy: "fixed_share"})
	if err != nil || !v.Pending || v.Policy != gpu.SchedFixedShare {
		t.Fatalf("pin while a VM runs: %+v, %v (want pending)", v, err)
	}
	e.m.RetryGPUInstanceSchedulers(ctx)
	if s, _ := e.host.NVML.GPUInstanceScheduler(ctx, uuid, gi); s.Policy != gpu.SchedEqualShare {
		t.Fatalf("driver changed under a running VM: %+v", s)
	}
	if v := giView(t, e, gi); !v.Pending {
		t.Fatalf("view does not show the pending pin: %+v", v)
	}
	if err := e.sim.CloseDevice(r.VF); err != nil {
		t.Fatal(err)
	}
	e.m.RetryGPUInstanceSchedulers(ctx)
	if s, _ := e.host.NVML.GPUInstanceScheduler(ctx, uuid, gi); s.Policy != gpu.SchedFixedShare {
		t.Fatalf("after the VM stopped the driver holds %+v", s)
	}
	if v := giView(t, e, gi); v.Pending || v.Policy != gpu.SchedFixedShare {
		t.Fatalf("after the VM stopped the view shows %+v", v)
	}

	// A module reload forgets it; the next retry sets it again.
	if err := e.sim.SetDriverLoaded(false); err != nil {
		t.Fatal(err)
	}
	if err := e.sim.SetDriverLoaded(true); err != nil {
		t.Fatal(err)
	}
	e.m.RetryGPUInstanceSchedulers(ctx)
	if s, _ := e.host.NVML.GPUInstanceScheduler(ctx, uuid, gi); s.Policy != gpu.SchedFixedShare {
		t.Fatalf("after a driver reload the driver holds %+v", s)
	}

	// A reboot takes the GPU instance; the start-up reconcile re-creates
	// it and sets the pin before VMs start.
	if err := e.sim.Reboot(); err != nil {
		t.Fatal(err)
	}
	e.restart()
	r2, err := e.m.Instance(r.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := e.host.NVML.GPUInstanceScheduler(ctx, uuid, r2.GIID); err != nil || s.Policy != gpu.SchedFixedShare {
		t.Fatalf("after a reboot the driver holds %+v, %v", s, err)
	}
	if v := giView(t, e, r2.GIID); v.Mode != manager.SchedPinned || v.Pending {
		t.Fatalf("after a reboot the view shows %+v", v)
	}

	// Dropped: the view says adaptive, and nothing sets it again.
	if v, err := e.m.SetGPUInstanceScheduler(ctx, rtxPro, r2.GIID, manager.SchedulerRequest{Mode: manager.SchedAdaptive}); err != nil || v.Mode != manager.SchedAdaptive {
		t.Fatalf("adaptive: %+v, %v", v, err)
	}
	if err := e.sim.Reboot(); err != nil {
		t.Fatal(err)
	}
	e.restart()
	r3, err := e.m.Instance(r.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := e.host.NVML.GPUInstanceScheduler(ctx, uuid, r3.GIID); s.Policy != gpu.SchedBestEffort {
		t.Fatalf("unpinned GPU instance after a reboot: %+v", s)
	}
	assertConsistent(t, e)
}
