package libvirtd

import (
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"
)

// TestPairMigrates: the two libvirtds of StartPair are two hosts to
// libvirt, and a TCG guest moves from one to the other with go-libvirt's
// peer-to-peer migration, shut off (its definition only) and running.
func TestPairMigrates(t *testing.T) {
	src, dst := StartPair(t)
	sl, dl := src.Client(t), dst.Client(t)

	for _, c := range []struct {
		e    *Env
		l    *libvirt.Libvirt
		want string
	}{{src, sl, PairSource}, {dst, dl, PairDestination}} {
		got, err := c.l.ConnectGetHostname()
		if err != nil {
			t.Fatalf("ConnectGetHostname: %v", err)
		}
		if got != c.want || c.e.Hostname() != c.want {
			t.Fatalf("hostname = %q (Env says %q), want %q", got, c.e.Hostname(), c.want)
		}
	}
	if src.HostUUID() == dst.HostUUID() || src.Socket() == dst.Socket() {
		t.Fatalf("the pair shares a host UUID or socket: %s %s", src.HostUUID(), src.Socket())
	}

	t.Run("offline", func(t *testing.T) {
		d := src.DefineDomain(t, "pair-offline")
		dst.RemoveAtCleanup(t, d)
		dom := lookup(t, sl, d.Name)
		// Offline needs persist-dest and no live; peer-to-peer because
		// go-libvirt has no client-side driver to run the five
		// steps of a managed migration across two connections.
		flags := libvirt.MigrateOffline | libvirt.MigratePersistDest | libvirt.MigrateUndefineSource | libvirt.MigratePeer2peer
		if _, err := sl.DomainMigratePerform3Params(dom, libvirt.OptString{dst.PeerURI()}, nil, nil, flags); err != nil {
			t.Fatalf("offline migration: %v", err)
		}
		if _, err := sl.DomainLookupByName(d.Name); !libvirt.IsNotFound(err) {
			t.Fatalf("source still has %s after an offline migration with undefine-source (err %v)", d.Name, err)
		}
		moved := lookup(t, dl, d.Name)
		if p, err := dl.DomainIsPersistent(moved); err != nil || p != 1 {
			t.Fatalf("destination's %s persistent = %d, %v", d.Name, p, err)
		}
	})

	t.Run("live", func(t *testing.T) {
		d := src.DefineDomain(t, "pair-live")
		dst.RemoveAtCleanup(t, d)
		src.StartDomain(t, d.Name)
		dom := lookup(t, sl, d.Name)
		params := []libvirt.TypedParam{{Field: libvirt.MigrateParamURI, Value: *libvirt.NewTypedParamValueString(MigrateURI(t))}}
		flags := libvirt.MigrateLive | libvirt.MigratePeer2peer | libvirt.MigratePersistDest | libvirt.MigrateUndefineSource
		if _, err := sl.DomainMigratePerform3Params(dom, libvirt.OptString{dst.PeerURI()}, params, nil, flags); err != nil {
			t.Fatalf("live migration: %v", err)
		}
		if _, err := sl.DomainLookupByName(d.Name); !libvirt.IsNotFound(err) {
			t.Fatalf("source still has %s after migrating it (err %v)", d.Name, err)
		}
		if got := strings.TrimSpace(dst.Virsh(t, "domstate", d.Name)); got != "running" {
			t.Fatalf("destination domstate = %q, want running", got)
		}
	})

	t.Run("no migrate URI: the destination's hostname does not resolve", func(t *testing.T) {
		d := src.DefineDomain(t, "pair-no-uri")
		dst.RemoveAtCleanup(t, d)
		src.StartDomain(t, d.Name)
		dom := lookup(t, sl, d.Name)
		flags := libvirt.MigrateLive | libvirt.MigratePeer2peer | libvirt.MigratePersistDest
		if _, err := sl.DomainMigratePerform3Params(dom, libvirt.OptString{dst.PeerURI()}, nil, nil, flags); err == nil {
			t.Fatal("a live migration without a migrate URI succeeded; MigrateURI's reason no longer holds")
		}
		if got := strings.TrimSpace(src.Virsh(t, "domstate", d.Name)); got != "running" {
			t.Fatalf("after the failed migration the source's domstate = %q, want running", got)
		}
	})
}

func lookup(t *testing.T, l *libvirt.Libvirt, name string) libvirt.Domain {
	t.Helper()
	d, err := l.DomainLookupByName(name)
	if err != nil {
		t.Fatalf("lookup %s: %v", name, err)
	}
	return d
}
