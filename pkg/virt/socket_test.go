package virt_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv/libvirtd"
	"github.com/vgpud/vgpud/pkg/virt"
)

// listen makes a unix socket at path that accepts connections until the
// test ends.
func listen(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
}

// TestResolveSocketOrder: the QEMU driver's socket is found as libvirt's
// clients find it for qemu:///system: virtqemud's when it exists, else
// the monolithic socket (libvirtd's, or virtproxyd's at the same path),
// which is also the answer when neither exists.
func TestResolveSocketOrder(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sockets []string
		want    string
	}{
		{"none", nil, virt.MonolithicSocket},
		{"libvirtd or virtproxyd", []string{virt.MonolithicSocket}, virt.MonolithicSocket},
		{"virtqemud alone", []string{virt.QEMUDaemonSocket}, virt.QEMUDaemonSocket},
		{"virtqemud and virtproxyd", []string{virt.MonolithicSocket, virt.QEMUDaemonSocket}, virt.QEMUDaemonSocket},
		{"other daemons only", []string{"virtnetworkd-sock", "virtstoraged-sock"}, virt.MonolithicSocket},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, s := range tc.sockets {
				listen(t, filepath.Join(dir, s))
			}
			want := filepath.Join(dir, tc.want)
			if got := virt.ResolveSocket(dir); got != want {
				t.Fatalf("ResolveSocket = %s, want %s", got, want)
			}
			for _, sock := range []string{"", virt.AutoSocket} {
				if got := (virt.Config{Socket: sock, SocketDir: dir}).SocketPath(); got != want {
					t.Fatalf("Config{Socket: %q}.SocketPath() = %s, want %s", sock, got, want)
				}
			}
		})
	}
	explicit := virt.Config{Socket: "/srv/libvirt-sock", SocketDir: t.TempDir()}
	if got := explicit.SocketPath(); got != "/srv/libvirt-sock" {
		t.Fatalf("an explicit socket resolved to %s", got)
	}
}

// TestAutoSocketConnects: with Socket auto, a connection reaches a real
// libvirtd through whichever socket the order picks, looked up again at
// every connection attempt; a virtqemud socket nobody serves is not passed
// over (libvirt's clients go by existence too) and the error names it.
func TestAutoSocketConnects(t *testing.T) {
	env := libvirtd.Start(t)
	dir := t.TempDir()
	mono := filepath.Join(dir, virt.MonolithicSocket)
	if err := os.Symlink(env.Socket(), mono); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn := func() (*virt.Conn, error) {
		return virt.Connect(ctx, virt.Config{Socket: virt.AutoSocket, SocketDir: dir, DialTimeout: 5 * time.Second})
	}
	c, err := conn()
	if err != nil {
		t.Fatalf("connect through %s: %v", mono, err)
	}
	if _, err := c.Domains(ctx); err != nil {
		t.Fatalf("list domains: %v", err)
	}
	if got := c.Socket(); got != mono {
		t.Fatalf("connected through %s, want %s", got, mono)
	}
	c.Close()

	qemud := filepath.Join(dir, virt.QEMUDaemonSocket)
	if err := os.Symlink(env.Socket(), qemud); err != nil {
		t.Fatal(err)
	}
	c, err = conn()
	if err != nil {
		t.Fatalf("connect through %s: %v", qemud, err)
	}
	if got := c.Socket(); got != qemud {
		t.Fatalf("connected through %s, want %s", got, qemud)
	}
	c.Close()

	// A stale virtqemud socket: the file is there, nobody listens.
	os.Remove(qemud)
	l, err := net.Listen("unix", qemud)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	_, err = conn()
	if !errors.Is(err, virt.ErrUnreachable) || !containsPath(err, qemud) {
		t.Fatalf("connect with a stale %s: %v, want ErrUnreachable naming it", qemud, err)
	}
}

func containsPath(err error, p string) bool {
	return err != nil && strings.Contains(err.Error(), p)
}
