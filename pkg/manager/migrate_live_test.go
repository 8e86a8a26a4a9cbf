package manager_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/virt"
)

// liveVersions are the versions each fake libvirt reports (default:
// Debian 12's, QEMU 7.2).
var liveVersions sync.Map // *migVirt -> virt.HostVersions

func (v *migVirt) HostVersions(context.Context) (virt.HostVersions, error) {
	if x, ok := liveVersions.Load(v); ok {
		return x.(virt.HostVersions), nil
	}
	return virt.HostVersions{Host: "debian12", Libvirt: virt.Version{Major: 9, Minor: 0, Micro: 0}, QEMU: virt.Version{Major: 7, Minor: 2, Micro: 22}, Kernel: virt.Version{Major: 6, Minor: 1, Micro: 0}}, nil
}

// PrecheckLive applies virt.CheckLiveMigration as Conn.PrecheckLive does:
// the domain holds a VFIO device while it runs with one live.
func (v *migVirt) PrecheckLive(ctx context.Context, ref string, dst virt.HostVersions) error {
	src, _ := v.HostVersions(ctx)
	v.mu.Lock()
	d, err := v.find(ref)
	vfio := false
	if err == nil {
		for _, a := range d.devs {
			vfio = vfio || (d.running && a.Live)
		}
	}
	v.mu.Unlock()
	if err != nil {
		return err
	}
	if err := virt.CheckLiveMigration(src, dst, vfio); err != nil {
		return fmt.Errorf("domain %s: %w", ref, err)
	}
	return nil
}

func (v *migVirt) MigrateLive(context.Context, string, virt.LiveMigration) error {
	return errors.New("not in this test")
}

// A running VM holding its vGPU does not move live where QEMU is 7.2:
// the source refuses before the destination is asked for anything, naming
// the reason with each end's version, and changes nothing; on new enough
// versions the check passes.
func TestPrecheckOutgoingLive(t *testing.T) {
	ctx := context.Background()
	src, dst := newMigHost(t, nil), newMigHost(t, nil)
	rec := src.running("A10-4Q")
	dstV, err := dst.m.MigrationTarget(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = src.m.PrecheckOutgoingLive(ctx, rec.UUID, dstV)
	if !errors.Is(err, manager.ErrConflict) || !errors.Is(err, virt.ErrLiveMigrationRefused) {
		t.Fatalf("precheck on QEMU 7.2: %v, want Conflict wrapping ErrLiveMigrationRefused", err)
	}
	for _, w := range []string{"qemu_too_old: QEMU 7.2.22 on the source (debian12) is older than 8.1.0", "qemu_too_old: QEMU 7.2.22 on the destination"} {
		if !strings.Contains(manager.Message(err), w) {
			t.Errorf("refusal %q lacks %q", manager.Message(err), w)
		}
	}
	if its := intents(t, src.env); len(its) != 0 {
		t.Fatalf("the refusal left intents: %+v", its)
	}
	if insts, _ := dst.m.AllInstances(); len(insts) != 0 {
		t.Fatalf("the destination carved: %+v", insts)
	}
	fresh := virt.HostVersions{Host: "new", Libvirt: virt.Version{Major: 10, Minor: 0, Micro: 0}, QEMU: virt.Version{Major: 8, Minor: 2, Micro: 0}, Kernel: virt.Version{Major: 6, Minor: 8, Micro: 0}}
	liveVersions.Store(src.v, fresh)
	t.Cleanup(func() { liveVersions.Delete(src.v) })
	if err := src.m.PrecheckOutgoingLive(ctx, rec.UUID, fresh); err != nil {
		t.Fatalf("precheck on QEMU 8.2: %v", err)
	}
	if err := src.m.PrecheckOutgoingLive(ctx, "0f0f0f0f-0000-4000-8000-000000000000", fresh); !errors.Is(err, manager.ErrNotFound) {
		t.Fatalf("precheck of an unknown instance: %v, want NotFound", err)
	}
}
