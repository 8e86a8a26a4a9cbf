package libvirtd

import (
	"fmt"
	"net"
	"testing"

	"github.com/google/uuid"
)

// Hostnames of the two libvirtds StartPair starts.
const (
	PairSource      = "vgpud-test-src"
	PairDestination = "vgpud-test-dst"
)

// StartPair starts two private libvirtds that libvirt takes for two hosts,
// for migration tests. A migration between two libvirtds on one machine
// is refused unless they differ in both of the things libvirt compares:
//
//   - the hostname (the migration cookie carries each end's, and an end
//     that finds its own refuses "to migrate guest to the same host"):
//     each runs in a UTS namespace of its own, named PairSource and
//     PairDestination;
//   - the host UUID (same cookie, same refusal; by default the machine's
//     SMBIOS UUID or machine-id, the same for both): each has its own
//     host_uuid in libvirtd.conf.
//
// Each also has the mount namespace, sockets and state directories of an
// Env from Start, so neither collides with the other, with a system
// libvirtd or with another test binary's. It needs root; unlike Start it
// never falls back on a shared libvirtd (one libvirtd cannot be two
// hosts). Only one Env (or pair) may be in use in a process at a time.
func StartPair(t testing.TB) (src, dst *Env) {
	t.Helper()
	if !inProcess.TryLock() {
		t.Fatal("libvirtd.StartPair: another Env is in use in this test binary; pass it down instead of starting a second one")
	}
	t.Cleanup(inProcess.Unlock)
	if why := cannotStart(); why != "" {
		skip(t, why)
	}
	src = startOwned(t, PairSource, uuid.NewString())
	dst = startOwned(t, PairDestination, uuid.NewString())
	return src, dst
}

// Hostname is the hostname of an Env from StartPair, which its libvirtd
// reports; "" for one from Start (whose libvirtd reports the machine's).
func (e *Env) Hostname() string { return e.hostname }

// HostUUID is the host_uuid in libvirtd.conf ("" when libvirt derives it
// from the machine).
func (e *Env) HostUUID() string { return e.hostUUID }

// PeerURI is the URI another libvirtd opens to reach this one, the
// destination URI (dconnuri) of a peer-to-peer migration: the socket is in
// the Env's directory, outside every private path, so the other
// namespace sees it at the same path.
func (e *Env) PeerURI() string {
	return "qemu+unix:///system?socket=" + e.socket
}

// MigrateURI returns a migration URI for QEMU's data channel on a free
// loopback port. Without one the destination tells the source to connect
// to its hostname (PairDestination here), which does not resolve, and
// the migration fails with "Unable to resolve address". The port is free
// when chosen; another process may take it before QEMU listens, which a
// test reports as a failed migration.
func MigrateURI(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("libvirtd: pick a migration port: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return fmt.Sprintf("tcp://127.0.0.1:%d", port)
}

// RemoveAtCleanup destroys (if running) and undefines d on this Env's
// libvirtd at cleanup: a domain defined on one Env of a pair and migrated to
// the other is removed where it ended up.
func (e *Env) RemoveAtCleanup(t testing.TB, d Domain) {
	t.Helper()
	t.Cleanup(func() { e.removeDomain(t, d.UUID) })
}
