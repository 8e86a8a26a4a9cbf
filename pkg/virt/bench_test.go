package virt_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv/libvirtd"
	"github.com/vgpud/vgpud/pkg/virt"
)

// BenchmarkAttachConfig attaches an mdev hostdev to a shut-off domain and
// detaches it again through pkg/virt: per iteration, the reads, the
// ErrAttachedElsewhere scan, the device change and the metadata write of
// both operations.
func BenchmarkAttachConfig(b *testing.B) {
	env := libvirtd.Start(b)
	c, err := virt.Connect(context.Background(), virt.Config{Socket: env.Socket(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	dom := env.DefineDomain(b, "virt-bench")
	ctx := context.Background()
	for b.Loop() {
		if _, err := c.Attach(ctx, dom.Name, mdevA, "inst-bench"); err != nil {
			b.Fatal(err)
		}
		if err := c.Detach(ctx, dom.Name, mdevA, "inst-bench"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAttachConfigVsVirsh attaches one mdev hostdev to a shut-off
// domain's config through pkg/virt and with `virsh attach-device --config`
// of the same XML on the same libvirtd and domain, alternating, each followed
// by a detach outside the timed part. It reports the median of each and
// their ratio (virt/virsh, goal at most 1.3): a ratio of two figures from
// one run, so load from other processes hits both alike. Starting the virsh
// process is part of its figure, as it is for an operator's call. It asserts
// nothing about time.
func BenchmarkAttachConfigVsVirsh(b *testing.B) {
	env := libvirtd.Start(b)
	c := connect(b, env, virt.Config{})
	dom := env.DefineDomain(b, "virt-bench-ratio")
	doc, err := virt.HostdevXML(mdevA)
	if err != nil {
		b.Fatal(err)
	}
	file := filepath.Join(b.TempDir(), "hostdev.xml")
	if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var ours, theirs []time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if _, err := c.Attach(ctx, dom.Name, mdevA, "inst-bench"); err != nil {
			b.Fatal(err)
		}
		ours = append(ours, time.Since(start))
		b.StopTimer()
		if err := c.Detach(ctx, dom.Name, mdevA, "inst-bench"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()

		start = time.Now()
		env.Virsh(b, "attach-device", dom.Name, file, "--config")
		theirs = append(theirs, time.Since(start))
		b.StopTimer()
		env.Virsh(b, "detach-device", dom.Name, file, "--config")
		b.StartTimer()
	}
	mo, mt := median(ours), median(theirs)
	b.ReportMetric(float64(mo.Microseconds())/1000, "ms-virt")
	b.ReportMetric(float64(mt.Microseconds())/1000, "ms-virsh")
	b.ReportMetric(float64(mo)/float64(mt), "virt/virsh")
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
