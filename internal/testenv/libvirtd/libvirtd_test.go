package libvirtd

import (
	"encoding/xml"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

func TestEnv(t *testing.T) {
	e := Start(t)

	t.Run("answers", func(t *testing.T) {
		v, err := e.Client(t).ConnectGetLibVersion()
		if err != nil {
			t.Fatalf("ConnectGetLibVersion: %v", err)
		}
		if v == 0 {
			t.Fatal("ConnectGetLibVersion returned 0")
		}
		if out := e.Virsh(t, "uri"); strings.TrimSpace(out) != e.URI() {
			t.Fatalf("virsh uri = %q, want %s", out, e.URI())
		}
	})

	t.Run("revive after a crash", func(t *testing.T) {
		if e.Revive(t) {
			t.Fatal("Revive restarted a libvirtd that runs")
		}
		if e.Exited(0) {
			t.Fatal("Exited says a libvirtd that runs has exited")
		}
		e.Crash(t)
		if !e.Exited(10 * time.Second) {
			t.Fatal("libvirtd still runs 10s after Crash")
		}
		if !e.Revive(t) {
			t.Fatal("Revive did not restart a libvirtd that crashed")
		}
		if _, err := e.Client(t).ConnectGetLibVersion(); err != nil {
			t.Fatalf("the revived libvirtd does not answer: %v", err)
		}
	})

	t.Run("define domain and undefine at cleanup", func(t *testing.T) {
		var d Domain
		t.Run("inner", func(t *testing.T) {
			d = e.DefineDomain(t, "testenv-define")
			out := e.Virsh(t, "domuuid", d.Name)
			if strings.TrimSpace(out) != d.UUID {
				t.Fatalf("domuuid = %q, want %s", out, d.UUID)
			}
		})
		if out, err := e.VirshErr("domuuid", d.Name); err == nil {
			t.Fatalf("domain %s still defined after cleanup: %s", d.Name, out)
		}
	})

	t.Run("same name twice fails instead of replacing", func(t *testing.T) {
		e.DefineDomain(t, "testenv-twice")
		// A fake TB records the Fatal instead of ending this test.
		ft := &fatalTB{TB: t}
		func() {
			defer func() { recover() }()
			e.DefineDomain(ft, "testenv-twice")
		}()
		if !ft.fatal {
			t.Fatal("second DefineDomain with the same name did not fail")
		}
	})

	t.Run("tiny domain starts, survives restart", func(t *testing.T) {
		d := e.DefineDomain(t, "testenv-start")
		e.StartDomain(t, d.Name)
		if got := strings.TrimSpace(e.Virsh(t, "domstate", d.Name)); got != "running" {
			t.Fatalf("domstate = %q, want running", got)
		}
		if !e.Owned() {
			t.Skip("libvirtd not started by the harness")
		}
		e.Restart(t)
		if got := strings.TrimSpace(e.Virsh(t, "domstate", d.Name)); got != "running" {
			t.Fatalf("after restart domstate = %q, want running", got)
		}
	})

	t.Run("stale domains are swept", func(t *testing.T) {
		// Define a marked domain without registering its cleanup, as a crashed
		// run would leave it.
		d := TinyDomain("testenv-stale")
		mark, err := xml.Marshal(marker{})
		if err != nil {
			t.Fatal(err)
		}
		d.Metadata = &libvirtxml.DomainMetadata{XML: string(mark)}
		doc, err := d.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		l := e.Client(t)
		if _, err := l.DomainDefineXML(doc); err != nil {
			t.Fatalf("define: %v", err)
		}
		// An unmarked domain must survive the sweep.
		keep := TinyDomain("testenv-unmarked")
		kdoc, _ := keep.Marshal()
		if _, err := l.DomainDefineXML(kdoc); err != nil {
			t.Fatalf("define: %v", err)
		}
		t.Cleanup(func() { e.removeDomain(t, keep.UUID) })

		e.sweepStale(t)
		if _, err := l.DomainLookupByName("testenv-stale"); !libvirt.IsNotFound(err) {
			t.Fatalf("marked domain still there after sweep (err %v)", err)
		}
		if _, err := l.DomainLookupByName("testenv-unmarked"); err != nil {
			t.Fatalf("unmarked domain removed by sweep: %v", err)
		}
	})
}

func TestSecondStartInProcessFails(t *testing.T) {
	Start(t)
	ft := &fatalTB{TB: t}
	func() {
		defer func() { recover() }()
		Start(ft)
	}()
	if !ft.fatal {
		t.Fatal("a second Env in use in one process was allowed")
	}
}

// fatalTB turns Fatal into a recorded flag plus a panic the caller recovers.
type fatalTB struct {
	testing.TB
	fatal bool
}

func (f *fatalTB) Fatal(args ...any) {
	f.fatal = true
	panic("fatal")
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.fatal = true
	panic("fatal")
}
