package virt_test

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/vgpud/vgpud/internal/testenv/libvirtd"
	"github.com/vgpud/vgpud/pkg/virt"
)

var (
	mdevA = virt.Hostdev{Kind: virt.Mdev, MdevUUID: mdevUUID}
	mdevB = virt.Hostdev{Kind: virt.Mdev, MdevUUID: mdevUUID2}
	vfA   = virt.Hostdev{Kind: virt.VF, PCI: vfAddr}
	gpuA  = virt.Hostdev{Kind: virt.Passthrough, PCI: gpuAddr}
)

func setup(t *testing.T) (*libvirtd.Env, *virt.Conn) {
	t.Helper()
	env := libvirtd.Start(t)
	return env, connect(t, env, virt.Config{})
}

func connect(t testing.TB, env *libvirtd.Env, cfg virt.Config) *virt.Conn {
	t.Helper()
	cfg.Socket = env.Socket()
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 30 * time.Second
	}
	if cfg.DetachTimeout == 0 {
		cfg.DetachTimeout = 5 * time.Second
	}
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c, err := virt.Connect(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// dumpXML is what `virsh dumpxml` shows, parsed.
func dumpXML(t *testing.T, env *libvirtd.Env, name string, inactive bool) (*libvirtxml.Domain, string) {
	t.Helper()
	args := []string{"dumpxml", name}
	if inactive {
		args = append(args, "--inactive")
	}
	doc := env.Virsh(t, args...)
	var d libvirtxml.Domain
	if err := d.Unmarshal(doc); err != nil {
		t.Fatalf("parse dumpxml: %v", err)
	}
	return &d, doc
}

// metadataIDs returns the instance ids in vgpud's metadata element as virsh
// shows it (nil when there is none).
func metadataIDs(t *testing.T, env *libvirtd.Env, name string, live bool) []string {
	t.Helper()
	which := "--config"
	if live {
		which = "--live"
	}
	out, err := env.VirshErr("metadata", name, "--uri", virt.MetadataNamespace, which)
	if err != nil {
		if strings.Contains(out, "not present") || strings.Contains(out, "metadata not found") {
			return nil
		}
		t.Fatalf("virsh metadata: %v\n%s", err, out)
	}
	var doc struct {
		XMLName   xml.Name `xml:"instances"`
		Instances []struct {
			ID string `xml:"id,attr"`
		} `xml:"instance"`
	}
	if err := xml.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("parse metadata %q: %v", out, err)
	}
	var ids []string
	for _, i := range doc.Instances {
		ids = append(ids, i.ID)
	}
	slices.Sort(ids)
	return ids
}

func hostdevs(d *libvirtxml.Domain) []libvirtxml.DomainHostdev {
	if d.Devices == nil {
		return nil
	}
	return d.Devices.Hostdevs
}

func TestAttachDetachConfig(t *testing.T) {
	env, c := setup(t)
	ctx := ctxT(t)
	dom := env.DefineDomain(t, "virt-config")

	for _, a := range []struct {
		h        virt.Hostdev
		instance string
	}{{mdevA, "inst-mdev"}, {vfA, "inst-vf"}} {
		live, err := c.Attach(ctx, dom.Name, a.h, a.instance)
		if err != nil {
			t.Fatalf("Attach %s: %v", a.h, err)
		}
		if live {
			t.Fatalf("Attach %s to a shut-off domain reported live", a.h)
		}
	}

	def, before := dumpXML(t, env, dom.Name, true)
	hds := hostdevs(def)
	if len(hds) != 2 {
		t.Fatalf("config has %d hostdevs, want 2:\n%s", len(hds), before)
	}
	checkHostdev(t, &hds[0], mdevA)
	checkHostdev(t, &hds[1], vfA)
	if got := metadataIDs(t, env, dom.Name, false); !slices.Equal(got, []string{"inst-mdev", "inst-vf"}) {
		t.Fatalf("metadata instances %q, want inst-mdev, inst-vf", got)
	}

	t.Run("attach again is a no-op", func(t *testing.T) {
		for _, a := range []struct {
			h        virt.Hostdev
			instance string
		}{{mdevA, "inst-mdev"}, {vfA, "inst-vf"}} {
			if _, err := c.Attach(ctx, dom.Name, a.h, a.instance); err != nil {
				t.Fatalf("Attach again: %v", err)
			}
		}
		if _, after := dumpXML(t, env, dom.Name, true); after != before {
			t.Fatalf("second attach changed the config:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})

	t.Run("Attached reports both with metadata", func(t *testing.T) {
		got, err := c.Attached(ctx, dom.Name)
		if err != nil {
			t.Fatal(err)
		}
		want := []virt.Attached{
			{Instance: "inst-mdev", Hostdev: mdevA, Config: true, MetadataConfig: true},
			{Instance: "inst-vf", Hostdev: vfA, Config: true, MetadataConfig: true},
		}
		if !slices.Equal(got, want) {
			t.Fatalf("Attached =\n%+v\nwant\n%+v", got, want)
		}
	})

	t.Run("Domain", func(t *testing.T) {
		d, err := c.Domain(ctx, dom.Name)
		if err != nil {
			t.Fatal(err)
		}
		if want := (virt.Domain{Name: dom.Name, UUID: dom.UUID, Persistent: true}); d != want {
			t.Fatalf("Domain = %+v, want %+v", d, want)
		}
	})

	t.Run("detach removes both and the metadata", func(t *testing.T) {
		if err := c.Detach(ctx, dom.Name, mdevA, "inst-mdev"); err != nil {
			t.Fatalf("Detach mdev: %v", err)
		}
		if got := metadataIDs(t, env, dom.Name, false); !slices.Equal(got, []string{"inst-vf"}) {
			t.Fatalf("metadata after first detach %q, want inst-vf", got)
		}
		if err := c.Detach(ctx, dom.Name, vfA, "inst-vf"); err != nil {
			t.Fatalf("Detach vf: %v", err)
		}
		def, doc := dumpXML(t, env, dom.Name, true)
		if n := len(hostdevs(def)); n != 0 {
			t.Fatalf("config still has %d hostdevs:\n%s", n, doc)
		}
		if got := metadataIDs(t, env, dom.Name, false); got != nil {
			t.Fatalf("metadata still lists %q", got)
		}
		// Absent: no-op.
		if err := c.Detach(ctx, dom.Name, vfA, "inst-vf"); err != nil {
			t.Fatalf("Detach of an absent hostdev: %v", err)
		}
	})
}

func TestAttachPassthroughAndDisplay(t *testing.T) {
	env, c := setup(t)
	ctx := ctxT(t)

	t.Run("passthrough is managed", func(t *testing.T) {
		dom := env.DefineDomain(t, "virt-passthrough")
		if _, err := c.Attach(ctx, dom.Name, gpuA, "inst-gpu"); err != nil {
			t.Fatal(err)
		}
		def, doc := dumpXML(t, env, dom.Name, true)
		if hds := hostdevs(def); len(hds) != 1 {
			t.Fatalf("want one hostdev:\n%s", doc)
		} else {
			checkHostdev(t, &hds[0], gpuA)
		}
	})

	t.Run("display without graphics is refused", func(t *testing.T) {
		dom := env.DefineDomain(t, "virt-nographics")
		_, before := dumpXML(t, env, dom.Name, true)
		h := virt.Hostdev{Kind: virt.Mdev, MdevUUID: mdevUUID, Display: true, RamFB: true}
		if _, err := c.Attach(ctx, dom.Name, h, "inst-q"); !errors.Is(err, virt.ErrNeedsGraphics) {
			t.Fatalf("Attach = %v, want ErrNeedsGraphics", err)
		}
		if _, after := dumpXML(t, env, dom.Name, true); after != before {
			t.Fatal("refused attach changed the config")
		}
	})

	t.Run("display with graphics", func(t *testing.T) {
		d := libvirtd.TinyDomain("virt-graphics")
		d.Devices.Graphics = []libvirtxml.DomainGraphic{{VNC: &libvirtxml.DomainGraphicVNC{}}}
		dom := env.DefineDomainXML(t, d)
		h := virt.Hostdev{Kind: virt.Mdev, MdevUUID: mdevUUID, Display: true, RamFB: true}
		if _, err := c.Attach(ctx, dom.Name, h, "inst-q"); err != nil {
			t.Fatal(err)
		}
		def, doc := dumpXML(t, env, dom.Name, true)
		if hds := hostdevs(def); len(hds) != 1 {
			t.Fatalf("want one hostdev:\n%s", doc)
		} else {
			checkHostdev(t, &hds[0], h)
		}
		got, err := c.Attached(ctx, dom.Name)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Hostdev != h {
			t.Fatalf("Attached = %+v, want the display hostdev", got)
		}
	})
}

// TestLiveAttachRollback: there is no VFIO here, so libvirt refuses to hot
// plug an mdev into a running TCG guest; the config must stay as it was.
// (A domain with an mdev or VF hostdev in its config cannot start here, so
// the domain starts without hostdevs.)
func TestLiveAttachRollback(t *testing.T) {
	env, c := setup(t)
	ctx := ctxT(t)
	dom := env.DefineDomain(t, "virt-live")
	env.StartDomain(t, dom.Name)
	_, cfgBefore := dumpXML(t, env, dom.Name, true)
	_, liveBefore := dumpXML(t, env, dom.Name, false)

	live, err := c.Attach(ctx, dom.Name, mdevA, "inst-mdev")
	if !errors.Is(err, virt.ErrLiveAttach) {
		t.Fatalf("Attach = %v, %v; want ErrLiveAttach", live, err)
	}
	var le *virt.LibvirtError
	if !errors.As(err, &le) || le.Code == 0 || le.Message == "" {
		t.Fatalf("error %v does not carry libvirt's code and message", err)
	}
	t.Logf("libvirt refused as expected: %v", err)
	if _, cfgAfter := dumpXML(t, env, dom.Name, true); cfgAfter != cfgBefore {
		t.Fatalf("failed live attach changed the config:\nbefore:\n%s\nafter:\n%s", cfgBefore, cfgAfter)
	}
	if _, liveAfter := dumpXML(t, env, dom.Name, false); liveAfter != liveBefore {
		t.Fatalf("failed live attach changed the live definition:\nbefore:\n%s\nafter:\n%s", liveBefore, liveAfter)
	}
	for _, live := range []bool{false, true} {
		if got := metadataIDs(t, env, dom.Name, live); got != nil {
			t.Fatalf("metadata (live=%v) lists %q after a failed attach", live, got)
		}
	}
	got, err := c.Attached(ctx, dom.Name)
	if err != nil || len(got) != 0 {
		t.Fatalf("Attached = %+v, %v; want nothing", got, err)
	}
	d, err := c.Domain(ctx, dom.Name)
	if err != nil || !d.Running {
		t.Fatalf("Domain = %+v, %v; want running", d, err)
	}
}

// TestLiveAttachRollbackBareDomain: a refused live attach to a domain that
// had no <metadata> at all (one defined from a plain file) leaves its
// inactive and live XML exactly as they were, with no empty <metadata/>
// behind, and the error carries libvirt's code and message.
func TestLiveAttachRollbackBareDomain(t *testing.T) {
	env, c := setup(t)
	ctx := ctxT(t)
	dom := env.DefineBareDomain(t, "virt-bare")
	env.StartDomain(t, dom.Name)
	_, cfgBefore := dumpXML(t, env, dom.Name, true)
	_, liveBefore := dumpXML(t, env, dom.Name, false)
	if strings.Contains(cfgBefore, "<metadata") || strings.Contains(liveBefore, "<metadata") {
		t.Fatalf("the bare domain has metadata:\n%s", cfgBefore)
	}

	_, err := c.Attach(ctx, dom.Name, mdevA, "inst-mdev")
	if !errors.Is(err, virt.ErrLiveAttach) {
		t.Fatalf("Attach = %v; want ErrLiveAttach", err)
	}
	var le *virt.LibvirtError
	if !errors.As(err, &le) || le.Code != 67 || !strings.Contains(le.Message, "VFIO") {
		t.Fatalf("error %v does not carry libvirt's code 67 (unsupported configuration) and message", err)
	}
	var raw libvirt.Error
	if !errors.As(err, &raw) || raw.Code != 67 {
		t.Fatalf("error %v does not wrap go-libvirt's libvirt.Error", err)
	}
	if _, cfgAfter := dumpXML(t, env, dom.Name, true); cfgAfter != cfgBefore {
		t.Fatalf("failed live attach changed the config:\nbefore:\n%s\nafter:\n%s", cfgBefore, cfgAfter)
	}
	if _, liveAfter := dumpXML(t, env, dom.Name, false); liveAfter != liveBefore {
		t.Fatalf("failed live attach changed the live definition:\nbefore:\n%s\nafter:\n%s", liveBefore, liveAfter)
	}
}

func TestNamedErrors(t *testing.T) {
	env, c := setup(t)
	ctx := ctxT(t)
	a := env.DefineDomain(t, "virt-owner")
	b := env.DefineDomain(t, "virt-other")
	if _, err := c.Attach(ctx, a.Name, mdevA, "inst-a"); err != nil {
		t.Fatal(err)
	}
	_, bBefore := dumpXML(t, env, b.Name, true)

	for _, tc := range []struct {
		name string
		call func() error
		want error
	}{
		{"attach to unknown domain", func() error { _, err := c.Attach(ctx, "virt-nosuch", mdevB, "x"); return err }, virt.ErrDomainNotFound},
		{"detach from unknown domain", func() error { return c.Detach(ctx, "virt-nosuch", mdevB, "x") }, virt.ErrDomainNotFound},
		{"Domain of unknown domain", func() error { _, err := c.Domain(ctx, "virt-nosuch"); return err }, virt.ErrDomainNotFound},
		{"Attached of unknown domain", func() error { _, err := c.Attached(ctx, "virt-nosuch"); return err }, virt.ErrDomainNotFound},
		{"domain on another host", func() error {
			_, err := c.Attach(ctx, "qemu+ssh://elsewhere/system/"+b.Name, mdevB, "x")
			return err
		}, virt.ErrOtherHost},
		{"hostdev in another domain", func() error { _, err := c.Attach(ctx, b.Name, mdevA, "inst-b"); return err }, virt.ErrAttachedElsewhere},
		{"instance in another domain", func() error { _, err := c.Attach(ctx, b.Name, mdevB, "inst-a"); return err }, virt.ErrAttachedElsewhere},
		{"bad hostdev", func() error {
			_, err := c.Attach(ctx, b.Name, virt.Hostdev{Kind: virt.VF, PCI: "41:00.4"}, "x")
			return err
		}, virt.ErrInvalidHostdev},
		{"empty instance", func() error { _, err := c.Attach(ctx, b.Name, mdevB, ""); return err }, virt.ErrInvalidHostdev},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if _, after := dumpXML(t, env, b.Name, true); after != bBefore {
				t.Fatalf("refused call changed %s", b.Name)
			}
		})
	}

	t.Run("own URI qualifies a name", func(t *testing.T) {
		d, err := c.Domain(ctx, c.URI()+"/"+a.Name)
		if err != nil || d.Name != a.Name {
			t.Fatalf("Domain(%s/%s) = %+v, %v", c.URI(), a.Name, d, err)
		}
	})
}

func TestReconnect(t *testing.T) {
	env, c := setup(t)
	if !env.Owned() {
		t.Skip("libvirtd not started by the harness; cannot restart it")
	}
	ctx := ctxT(t)
	dom := env.DefineDomain(t, "virt-reconnect")
	if _, err := c.Attach(ctx, dom.Name, mdevA, "inst-1"); err != nil {
		t.Fatal(err)
	}

	t.Run("next call after restart succeeds", func(t *testing.T) {
		env.Restart(t)
		if _, err := c.Attach(ctx, dom.Name, vfA, "inst-2"); err != nil {
			t.Fatalf("Attach after restart: %v", err)
		}
		got, err := c.Attached(ctx, dom.Name)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 {
			t.Fatalf("Attached = %+v, want 2", got)
		}
	})

	t.Run("call while down waits for the new libvirtd", func(t *testing.T) {
		env.StopDaemon(t)
		type res struct {
			live bool
			err  error
		}
		done := make(chan res, 1)
		go func() {
			live, err := c.Attach(ctx, dom.Name, mdevB, "inst-3")
			done <- res{live, err}
		}()
		env.StartDaemon(t)
		r := <-done
		if r.err != nil {
			t.Fatalf("Attach across the restart: %v", r.err)
		}
		def, doc := dumpXML(t, env, dom.Name, true)
		n := 0
		for _, hd := range hostdevs(def) {
			if hd.SubsysMDev != nil && hd.SubsysMDev.Source.Address.UUID == mdevUUID2 {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("mdev %s in config %d times, want once:\n%s", mdevUUID2, n, doc)
		}
		if got := metadataIDs(t, env, dom.Name, false); !slices.Equal(got, []string{"inst-1", "inst-2", "inst-3"}) {
			t.Fatalf("metadata %q", got)
		}
	})

	t.Run("down past the timeout is ErrUnreachable", func(t *testing.T) {
		short := connect(t, env, virt.Config{CallTimeout: 500 * time.Millisecond})
		env.StopDaemon(t)
		start := time.Now()
		_, err := short.Domain(ctx, dom.Name)
		elapsed := time.Since(start)
		env.StartDaemon(t)
		if !errors.Is(err, virt.ErrUnreachable) {
			t.Fatalf("Domain with libvirtd down = %v, want ErrUnreachable", err)
		}
		if elapsed > 3*time.Second {
			t.Fatalf("ErrUnreachable after %v, CallTimeout is 500ms", elapsed)
		}
		if _, err := short.Domain(ctx, dom.Name); err != nil {
			t.Fatalf("Domain after libvirtd is back: %v", err)
		}
	})
}

func TestEvents(t *testing.T) {
	env, c := setup(t)
	ctx := ctxT(t)
	events := c.Events(ctx)
	dom := env.DefineDomain(t, "virt-events")

	// want reads events until one of kind k for the test domain (or any
	// Reconnected) arrives; other events (other domains, Defined after a
	// config change) are skipped.
	want := func(k virt.EventKind) {
		t.Helper()
		timeout := time.After(20 * time.Second)
		for {
			select {
			case e, ok := <-events:
				if !ok {
					t.Fatalf("event channel closed waiting for %v", k)
				}
				if k == virt.Reconnected && e.Kind == virt.Reconnected {
					return
				}
				if e.UUID != dom.UUID {
					continue
				}
				if e.Domain != dom.Name {
					t.Fatalf("event %+v names %q, want %q", e, e.Domain, dom.Name)
				}
				if e.Kind == k {
					return
				}
				t.Logf("skipping %v while waiting for %v", e.Kind, k)
			case <-timeout:
				t.Fatalf("no %v event within 20s", k)
			}
		}
	}

	want(virt.Defined)
	env.StartDomain(t, dom.Name)
	want(virt.Started)
	env.DestroyDomain(t, dom.Name)
	want(virt.Stopped)

	if env.Owned() {
		env.Restart(t)
		want(virt.Reconnected)
		env.StartDomain(t, dom.Name)
		want(virt.Started)
		env.DestroyDomain(t, dom.Name)
		want(virt.Stopped)
	} else {
		t.Log("libvirtd not started by the harness: restart part skipped")
	}
	env.Virsh(t, "undefine", dom.Name)
	want(virt.Undefined)
}

func TestUnreachable(t *testing.T) {
	t.Run("no socket", func(t *testing.T) {
		start := time.Now()
		_, err := virt.Connect(context.Background(), virt.Config{
			Socket: filepath.Join(t.TempDir(), "nosuch-sock"), DialTimeout: time.Second,
		})
		if !errors.Is(err, virt.ErrUnreachable) {
			t.Fatalf("Connect = %v, want ErrUnreachable", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("took %v", d)
		}
	})
	t.Run("socket that never answers", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "mute-sock")
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				// Read and never answer, like a hung libvirtd.
				go io.Copy(io.Discard, conn)
			}
		}()
		start := time.Now()
		_, err = virt.Connect(context.Background(), virt.Config{Socket: path, DialTimeout: 500 * time.Millisecond})
		if !errors.Is(err, virt.ErrUnreachable) {
			t.Fatalf("Connect = %v, want ErrUnreachable", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("took %v with DialTimeout 500ms", d)
		}
	})
}

// TestConcurrentAttachOneDevice: two domains race for one mdev through one
// Conn; exactly one gets it.
func TestConcurrentAttachOneDevice(t *testing.T) {
	env, c := setup(t)
	ctx := ctxT(t)
	doms := []libvirtd.Domain{env.DefineDomain(t, "virt-race-a"), env.DefineDomain(t, "virt-race-b")}
	errs := make(chan error, len(doms))
	for i, d := range doms {
		go func() {
			_, err := c.Attach(ctx, d.Name, mdevA, "inst-race-"+string(rune('a'+i)))
			errs <- err
		}()
	}
	var ok, elsewhere int
	for range doms {
		switch err := <-errs; {
		case err == nil:
			ok++
		case errors.Is(err, virt.ErrAttachedElsewhere):
			elsewhere++
		default:
			t.Fatalf("Attach: %v", err)
		}
	}
	if ok != 1 || elsewhere != 1 {
		t.Fatalf("%d attached, %d ErrAttachedElsewhere; want 1 and 1", ok, elsewhere)
	}
	total := 0
	for _, d := range doms {
		def, _ := dumpXML(t, env, d.Name, true)
		total += len(hostdevs(def))
	}
	if total != 1 {
		t.Fatalf("the mdev is in %d configs, want 1", total)
	}
}

// TestConcurrentAttachOneDomain: several devices attached to, then detached
// from, one domain at once through one Conn. Each operation rewrites the
// domain's vgpud metadata element from the list it read, so without
// serialization per domain some entries would be lost (or left behind).
func TestConcurrentAttachOneDomain(t *testing.T) {
	env, c := setup(t)
	ctx := ctxT(t)
	dom := env.DefineDomain(t, "virt-race-one")
	const n = 6
	devs := make([]virt.Hostdev, n)
	var want []string
	for i := range devs {
		devs[i] = virt.Hostdev{Kind: virt.Mdev, MdevUUID: fmt.Sprintf("4b20d080-1b54-4048-85b3-a6a62d1660%02x", i)}
		want = append(want, fmt.Sprintf("inst-many-%d", i))
	}
	run := func(op func(i int) error) {
		errs := make(chan error, n)
		for i := range devs {
			go func() { errs <- op(i) }()
		}
		for range devs {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
	run(func(i int) error {
		_, err := c.Attach(ctx, dom.Name, devs[i], want[i])
		return err
	})
	if got := metadataIDs(t, env, dom.Name, false); !slices.Equal(got, want) {
		t.Fatalf("config metadata after %d concurrent attaches: %v, want %v", n, got, want)
	}
	if def, doc := dumpXML(t, env, dom.Name, true); len(hostdevs(def)) != n {
		t.Fatalf("%d hostdevs in the config, want %d:\n%s", len(hostdevs(def)), n, doc)
	}
	run(func(i int) error { return c.Detach(ctx, dom.Name, devs[i], want[i]) })
	if got := metadataIDs(t, env, dom.Name, false); len(got) != 0 {
		t.Fatalf("config metadata after %d concurrent detaches: %v, want none", n, got)
	}
	if def, doc := dumpXML(t, env, dom.Name, true); len(hostdevs(def)) != 0 {
		t.Fatalf("hostdevs left in the config:\n%s", doc)
	}
}
