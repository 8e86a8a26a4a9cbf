package virt_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"libvirt.org/go/libvirtxml"

	"github.com/vgpud/vgpud/internal/testenv/libvirtd"
	"github.com/vgpud/vgpud/pkg/virt"
)

// pair connects to the two libvirtds of libvirtd.StartPair.
func pair(t *testing.T) (srcEnv, dstEnv *libvirtd.Env, src, dst *virt.Conn) {
	t.Helper()
	srcEnv, dstEnv = libvirtd.StartPair(t)
	return srcEnv, dstEnv, connect(t, srcEnv, virt.Config{}), connect(t, dstEnv, virt.Config{})
}

// withMdevConfig defines a tiny domain whose persistent config holds the
// mdev h (a domain that cannot start here: no VFIO), removed at cleanup
// on both ends.
func withMdevConfig(t *testing.T, srcEnv, dstEnv *libvirtd.Env, name string, h virt.Hostdev) libvirtd.Domain {
	t.Helper()
	doc, err := virt.HostdevXML(h)
	if err != nil {
		t.Fatal(err)
	}
	var hd libvirtxml.DomainHostdev
	if err := hd.Unmarshal(doc); err != nil {
		t.Fatal(err)
	}
	d := libvirtd.TinyDomain(name)
	d.Devices.Hostdevs = []libvirtxml.DomainHostdev{hd}
	dom := srcEnv.DefineDomainXML(t, d)
	dstEnv.RemoveAtCleanup(t, dom)
	return dom
}

func TestMigrateOffline(t *testing.T) {
	srcEnv, dstEnv, src, dst := pair(t)
	ctx := ctxT(t)
	to := virt.Hostdev{Kind: virt.Mdev, MdevUUID: dstMdev}

	for _, keep := range []bool{false, true} {
		name := map[bool]string{false: "mig-offline", true: "mig-offline-keep"}[keep]
		t.Run(name, func(t *testing.T) {
			dom := withMdevConfig(t, srcEnv, dstEnv, name, mdevA)
			x, err := src.DestinationXML(ctx, name, mdevA, to, "dst-inst")
			if err != nil {
				t.Fatalf("DestinationXML: %v", err)
			}
			if x.Live != "" || x.VGPULive || x.Persistent == "" {
				t.Fatalf("DestinationXML of a shut-off domain = %+v", x)
			}
			srcXML, err := src.DomainXML(ctx, name, true)
			if err != nil {
				t.Fatal(err)
			}
			if err := virt.CheckDestXML(srcXML, x.Persistent, mdevA, to); err != nil {
				t.Fatalf("CheckDestXML: %v", err)
			}
			validate(t, x.Persistent)
			if err := src.MigrateOffline(ctx, dst, name, x.Persistent, keep); err != nil {
				t.Fatalf("MigrateOffline: %v", err)
			}
			got, err := dst.Attached(ctx, name)
			if err != nil {
				t.Fatalf("destination: %v", err)
			}
			if len(got) != 1 || got[0].Hostdev.MdevUUID != dstMdev || !got[0].Config || got[0].Live {
				t.Fatalf("destination holds %+v, want %s in its config", got, dstMdev)
			}
			d, err := dst.Domain(ctx, name)
			if err != nil || d.UUID != dom.UUID || !d.Persistent || d.Running {
				t.Fatalf("destination domain = %+v, %v", d, err)
			}
			_, err = src.Domain(ctx, name)
			if keep && err != nil {
				t.Fatalf("KeepSource: source lost the domain: %v", err)
			}
			if !keep && !errors.Is(err, virt.ErrDomainNotFound) {
				t.Fatalf("source still has the domain (err %v)", err)
			}
			if !keep {
				// A repeat finds the work done.
				if err := src.MigrateOffline(ctx, dst, name, x.Persistent, false); err != nil {
					t.Fatalf("repeated MigrateOffline: %v", err)
				}
			}
		})
	}

	t.Run("running domain refused", func(t *testing.T) {
		d := srcEnv.DefineDomain(t, "mig-offline-running")
		srcEnv.StartDomain(t, d.Name)
		x, err := src.DomainXML(ctx, d.Name, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := src.MigrateOffline(ctx, dst, d.Name, x, false); !errors.Is(err, virt.ErrDomainRunning) {
			t.Fatalf("MigrateOffline of a running domain: %v, want ErrDomainRunning", err)
		}
		if _, err := dst.Domain(ctx, d.Name); !errors.Is(err, virt.ErrDomainNotFound) {
			t.Fatalf("the destination got the domain (err %v)", err)
		}
	})

	t.Run("the halves refuse a running domain and bad XML", func(t *testing.T) {
		d := dstEnv.DefineDomain(t, "mig-define-running")
		dstEnv.StartDomain(t, d.Name)
		doc, err := dst.DomainXML(ctx, d.Name, true)
		if err != nil {
			t.Fatal(err)
		}
		// The same UUID arriving while it runs here must not replace its
		// configuration.
		if _, err := dst.DefineMigrated(ctx, doc); !errors.Is(err, virt.ErrDomainRunning) {
			t.Fatalf("DefineMigrated over a running domain: %v, want ErrDomainRunning", err)
		}
		if err := dst.UndefineMigrated(ctx, d.Name); !errors.Is(err, virt.ErrDomainRunning) {
			t.Fatalf("UndefineMigrated of a running domain: %v, want ErrDomainRunning", err)
		}
		if _, err := dst.DefineMigrated(ctx, "<domain><name>x</name></domain>"); !errors.Is(err, virt.ErrBadDestXML) {
			t.Fatalf("DefineMigrated without a UUID: %v, want ErrBadDestXML", err)
		}
		if err := dst.UndefineMigrated(ctx, "mig-no-such-domain"); err != nil {
			t.Fatalf("UndefineMigrated of a domain already gone: %v", err)
		}
		if got := strings.TrimSpace(dstEnv.Virsh(t, "domstate", d.Name)); got != "running" {
			t.Fatalf("domstate = %q after the refusals", got)
		}
	})

	t.Run("a domain with a snapshot is not undefined", func(t *testing.T) {
		d := srcEnv.DefineDomain(t, "mig-undefine-snapshot")
		drop := srcEnv.SnapshotDomain(t, d.Name)
		if err := src.UndefineMigrated(ctx, d.Name); !errors.Is(err, virt.ErrUndefineRefused) {
			t.Fatalf("UndefineMigrated of a domain with a snapshot: %v, want ErrUndefineRefused", err)
		}
		if _, err := src.Domain(ctx, d.Name); err != nil {
			t.Fatalf("the domain went: %v", err)
		}
		drop()
		if err := src.UndefineMigrated(ctx, d.Name); err != nil {
			t.Fatalf("UndefineMigrated without the snapshot: %v", err)
		}
	})

	t.Run("another domain's XML refused", func(t *testing.T) {
		d := srcEnv.DefineDomain(t, "mig-offline-other")
		other := libvirtd.TinyDomain("mig-offline-impostor")
		doc, _ := other.Marshal()
		if err := src.MigrateOffline(ctx, dst, d.Name, doc, false); !errors.Is(err, virt.ErrBadDestXML) {
			t.Fatalf("MigrateOffline with another domain's XML: %v, want ErrBadDestXML", err)
		}
	})
}

func TestMigrateLive(t *testing.T) {
	srcEnv, dstEnv, src, dst := pair(t)
	ctx := ctxT(t)
	srcV, err := src.HostVersions(ctx)
	if err != nil {
		t.Fatalf("HostVersions: %v", err)
	}
	dstV, err := dst.HostVersions(ctx)
	if err != nil {
		t.Fatalf("HostVersions: %v", err)
	}
	t.Logf("source %+v, destination %+v", srcV, dstV)
	if srcV.Host != libvirtd.PairSource || dstV.Host != libvirtd.PairDestination {
		t.Fatalf("hosts = %s, %s", srcV.Host, dstV.Host)
	}

	t.Run("vGPU live refused: QEMU too old here", func(t *testing.T) {
		if !srcV.QEMU.Less(virt.MinQEMUVFIOMigration) {
			t.Skipf("QEMU %s here migrates VFIO devices", srcV.QEMU)
		}
		// No domain here can hold a VFIO device live, so the check runs
		// on the versions both libvirtds report.
		err := virt.CheckLiveMigration(srcV, dstV, true)
		var pe *virt.PrecheckError
		if !errors.Is(err, virt.ErrLiveMigrationRefused) || !errors.As(err, &pe) {
			t.Fatalf("CheckLiveMigration: %v, want ErrLiveMigrationRefused", err)
		}
		want := []virt.Refusal{
			{Reason: virt.ReasonQEMUTooOld, End: "source", Host: libvirtd.PairSource, Have: srcV.QEMU, Need: virt.Version{8, 1, 0}},
			{Reason: virt.ReasonQEMUTooOld, End: "destination", Host: libvirtd.PairDestination, Have: dstV.QEMU, Need: virt.Version{8, 1, 0}},
		}
		if len(pe.Refusals) != 2 || pe.Refusals[0] != want[0] || pe.Refusals[1] != want[1] {
			t.Fatalf("refusals = %+v, want %+v", pe.Refusals, want)
		}
		t.Log(err)
	})

	t.Run("vGPU in the config only migrates live", func(t *testing.T) {
		d := srcEnv.DefineDomain(t, "mig-live-cfg")
		dstEnv.RemoveAtCleanup(t, d)
		srcEnv.StartDomain(t, d.Name)
		doc, err := virt.HostdevXML(mdevA)
		if err != nil {
			t.Fatal(err)
		}
		hd := t.TempDir() + "/hostdev.xml"
		writeFile(t, hd, doc)
		srcEnv.Virsh(t, "attach-device", d.Name, hd, "--config")
		if err := src.PrecheckLive(ctx, d.Name, dstV); err != nil {
			t.Fatalf("PrecheckLive: %v", err)
		}
		to := virt.Hostdev{Kind: virt.Mdev, MdevUUID: dstMdev}
		x, err := src.DestinationXML(ctx, d.Name, mdevA, to, "dst-inst")
		if err != nil {
			t.Fatalf("DestinationXML: %v", err)
		}
		if x.VGPULive || x.Live == "" || x.Persistent == "" {
			t.Fatalf("DestinationXML = VGPULive %v, live %d bytes, persistent %d bytes", x.VGPULive, len(x.Live), len(x.Persistent))
		}
		validate(t, x.Persistent)
		validate(t, x.Live)
		var mu sync.Mutex
		var seen []virt.MigrationProgress
		err = src.MigrateLive(ctx, d.Name, virt.LiveMigration{
			DestURI: dstEnv.PeerURI(), MigrateURI: libvirtd.MigrateURI(t),
			DestXML: x.Live, PersistXML: x.Persistent, Dest: dstV,
			Timeout: time.Minute, ProgressEvery: 100 * time.Millisecond,
			OnProgress: func(p virt.MigrationProgress) { mu.Lock(); seen = append(seen, p); mu.Unlock() },
		})
		if err != nil {
			t.Fatalf("MigrateLive: %v", err)
		}
		mu.Lock()
		t.Logf("%d progress reports; last %+v", len(seen), seen[max(0, len(seen)-1):])
		mu.Unlock()
		if got := strings.TrimSpace(dstEnv.Virsh(t, "domstate", d.Name)); got != "running" {
			t.Fatalf("destination domstate = %q, want running", got)
		}
		got, err := dst.Attached(ctx, d.Name)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Hostdev.MdevUUID != dstMdev || !got[0].Config || got[0].Live {
			t.Fatalf("destination holds %+v, want %s in its config only", got, dstMdev)
		}
		if _, err := src.Domain(ctx, d.Name); !errors.Is(err, virt.ErrDomainNotFound) {
			t.Fatalf("source still has the domain (err %v)", err)
		}
	})

	t.Run("abort", func(t *testing.T) {
		d := srcEnv.DefineDomain(t, "mig-live-abort")
		dstEnv.RemoveAtCleanup(t, d)
		srcEnv.StartDomain(t, d.Name)
		done := make(chan error, 1)
		go func() {
			// 1 MiB/s keeps the job running for a couple of seconds.
			done <- src.MigrateLive(ctx, d.Name, virt.LiveMigration{
				DestURI: dstEnv.PeerURI(), MigrateURI: libvirtd.MigrateURI(t), Dest: dstV, Bandwidth: 1, Timeout: time.Minute,
			})
		}()
		deadline := time.Now().Add(20 * time.Second)
		for {
			p, err := src.MigrationProgress(ctx, d.Name)
			if err != nil {
				t.Fatalf("MigrationProgress: %v", err)
			}
			if p.Active {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the migration job did not show up")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := src.AbortMigration(ctx, d.Name); err != nil {
			t.Fatalf("AbortMigration: %v", err)
		}
		if err := <-done; !errors.Is(err, virt.ErrMigrationAborted) {
			t.Fatalf("MigrateLive after abort: %v, want ErrMigrationAborted", err)
		}
		assertStayed(t, ctx, src, dst, d.Name)
		// The downtime bound was set before the migration started.
		if got := strings.TrimSpace(srcEnv.Virsh(t, "migrate-getmaxdowntime", d.Name)); got != "500" {
			t.Fatalf("max downtime = %q ms, want 500", got)
		}
	})

	t.Run("deadline aborts", func(t *testing.T) {
		d := srcEnv.DefineDomain(t, "mig-live-deadline")
		dstEnv.RemoveAtCleanup(t, d)
		srcEnv.StartDomain(t, d.Name)
		err := src.MigrateLive(ctx, d.Name, virt.LiveMigration{
			DestURI: dstEnv.PeerURI(), MigrateURI: libvirtd.MigrateURI(t), Dest: dstV, Bandwidth: 1, Timeout: 300 * time.Millisecond,
		})
		if !errors.Is(err, virt.ErrMigrationAborted) || !errors.Is(err, virt.ErrTimeout) {
			t.Fatalf("MigrateLive past its timeout: %v, want ErrMigrationAborted and ErrTimeout", err)
		}
		assertStayed(t, ctx, src, dst, d.Name)
	})
}

// assertStayed checks that an aborted migration left the domain running on
// the source and nothing on the destination.
func assertStayed(t *testing.T, ctx context.Context, src, dst *virt.Conn, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := dst.Domain(ctx, name)
		if errors.Is(err, virt.ErrDomainNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the destination still has %s after the abort (err %v)", name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	d, err := src.Domain(ctx, name)
	if err != nil || !d.Running {
		t.Fatalf("source domain after the abort = %+v, %v; want running", d, err)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
