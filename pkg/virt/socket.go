package virt

import (
	"os"
	"path/filepath"
)

// AutoSocket, as Config.Socket (or an empty Socket), finds the QEMU
// driver's socket the way libvirt's own clients do for qemu:///system
// (libvirt's remote driver in its "auto" mode, src/remote/remote_sockets.c):
// the per-driver daemon's socket when it exists, else the monolithic
// socket, which is libvirtd's or, on hosts running the modular daemons,
// virtproxyd's (it listens at the same path for old clients). It is looked
// up again at every connection attempt, so a host that switches daemons,
// or starts them after vgpud, is followed.
const AutoSocket = "auto"

// DefaultSocketDir is where the system daemons' sockets are.
const DefaultSocketDir = "/run/libvirt"

// The socket names, in the order AutoSocket tries them.
const (
	// QEMUDaemonSocket is virtqemud's (the modular QEMU daemon).
	QEMUDaemonSocket = "virtqemud-sock"
	// MonolithicSocket is libvirtd's, or virtproxyd's in its place.
	MonolithicSocket = "libvirt-sock"
)

// ResolveSocket is the socket AutoSocket uses in dir: dir/virtqemud-sock
// when it exists, else dir/libvirt-sock. When neither exists it is
// dir/libvirt-sock, as for libvirt's clients built with their default
// (legacy) mode: the error then names the socket most hosts have.
func ResolveSocket(dir string) string {
	direct := filepath.Join(dir, QEMUDaemonSocket)
	if _, err := os.Stat(direct); err == nil {
		return direct
	}
	return filepath.Join(dir, MonolithicSocket)
}

// auto reports whether the configuration asks for AutoSocket.
func (c Config) auto() bool { return c.Socket == "" || c.Socket == AutoSocket }

// SocketPath is the socket a connection attempt made now would dial.
func (c Config) SocketPath() string {
	if !c.auto() {
		return c.Socket
	}
	dir := c.SocketDir
	if dir == "" {
		dir = DefaultSocketDir
	}
	return ResolveSocket(dir)
}

// where names the socket for messages: the path, and whether it was found
// automatically.
func (c Config) where() string {
	if c.auto() {
		return c.SocketPath() + " (auto)"
	}
	return c.Socket
}
