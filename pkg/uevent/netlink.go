//go:build linux

package uevent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// kernelGroup is the multicast group the kernel sends uevents to (udevd
// re-broadcasts them to group 2 in its own "libudev" framing).
const kernelGroup = 1

// DefaultReceiveBuffer is the socket receive buffer Netlink asks for: room
// for a few thousand queued uevents, enough for SR-IOV enabling dozens of
// VFs on every GPU of a host at once. What does not fit is reported as
// ErrOverflow.
const DefaultReceiveBuffer = 4 << 20

// NetlinkOptions configure OpenNetlink.
type NetlinkOptions struct {
	// ReceiveBuffer is the socket's receive buffer in bytes; 0 means
	// DefaultReceiveBuffer. With CAP_NET_ADMIN it may exceed
	// net.core.rmem_max; without, the kernel caps it there.
	ReceiveBuffer int
}

// Netlink is a Source on the kernel's NETLINK_KOBJECT_UEVENT socket.
//
// The socket is read directly with recvfrom(2) rather than through
// vishvananda/netlink's NetlinkSocket.Receive: kobject uevents are bare
// "ACTION@DEVPATH\0..." datagrams without the nlmsghdr framing that
// Receive parses.
type Netlink struct {
	f  *os.File
	rc syscall.RawConn

	// mu serialises Next; gen tells a cancellation that fires late (after
	// its Next returned) not to disturb the next call's deadline.
	mu      sync.Mutex
	dlMu    sync.Mutex
	gen     uint64
	buf     []byte
	closing atomic.Bool
}

var _ Source = (*Netlink)(nil)

// OpenNetlink opens and binds a uevent socket. Any process may receive
// kernel uevents; no capability is needed beyond being allowed AF_NETLINK
// sockets (a unit's RestrictAddressFamilies= must list AF_NETLINK).
func OpenNetlink(opts NetlinkOptions) (*Netlink, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return nil, fmt.Errorf("open uevent netlink socket: %w", err)
	}
	size := opts.ReceiveBuffer
	if size <= 0 {
		size = DefaultReceiveBuffer
	}
	// SO_RCVBUFFORCE passes rmem_max with CAP_NET_ADMIN; without it the
	// plain option is capped by the kernel, which is still useful.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, size)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: kernelGroup}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind uevent netlink socket: %w", err)
	}
	// A non-blocking descriptor is registered with the runtime's poller, so
	// reads park the goroutine and deadlines interrupt them.
	f := os.NewFile(uintptr(fd), "uevent-netlink")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("uevent netlink socket: %w", err)
	}
	return &Netlink{f: f, rc: rc, buf: make([]byte, maxMessage)}, nil
}

// ReceiveBuffer reports the socket's receive buffer size as the kernel
// set it (it doubles the requested value for bookkeeping).
func (n *Netlink) ReceiveBuffer() (int, error) {
	var size int
	var serr error
	err := n.rc.Control(func(fd uintptr) {
		size, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
	})
	if err != nil {
		return 0, err
	}
	return size, serr
}

// Next returns the next kernel uevent. Messages not sent by the kernel
// (udevd's, another process's) are skipped.
func (n *Netlink) Next(ctx context.Context) (Event, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closing.Load() {
		return Event{}, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return Event{}, err
	}
	n.dlMu.Lock()
	n.gen++
	gen := n.gen
	n.dlMu.Unlock()
	if err := n.f.SetReadDeadline(time.Time{}); err != nil {
		return Event{}, n.closedOr(err)
	}
	stop := context.AfterFunc(ctx, func() {
		n.dlMu.Lock()
		defer n.dlMu.Unlock()
		if n.gen == gen {
			_ = n.f.SetReadDeadline(time.Unix(1, 0))
		}
	})
	defer func() {
		stop()
		n.dlMu.Lock()
		n.gen++
		n.dlMu.Unlock()
	}()
	for {
		var nr int
		var from unix.Sockaddr
		var rerr error
		err := n.rc.Read(func(fd uintptr) bool {
			nr, from, rerr = unix.Recvfrom(int(fd), n.buf, 0)
			return rerr != unix.EAGAIN && rerr != unix.EWOULDBLOCK
		})
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return Event{}, cerr
			}
			return Event{}, n.closedOr(err)
		}
		switch {
		case errors.Is(rerr, unix.ENOBUFS):
			return Event{}, ErrOverflow
		case errors.Is(rerr, unix.EINTR):
			continue
		case rerr != nil:
			return Event{}, fmt.Errorf("read uevent: %w", rerr)
		}
		if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != 0 {
			continue // only the kernel sends from port 0
		}
		ev, err := Parse(n.buf[:nr])
		if errors.Is(err, ErrNotKernel) {
			continue
		}
		return ev, err
	}
}

func (n *Netlink) closedOr(err error) error {
	if n.closing.Load() || errors.Is(err, os.ErrClosed) {
		return ErrClosed
	}
	return fmt.Errorf("read uevent: %w", err)
}

// Close closes the socket; a blocked Next returns ErrClosed.
func (n *Netlink) Close() error {
	// Closing the file wakes a Next parked in the poller, which then sees
	// closing and returns ErrClosed.
	if n.closing.Swap(true) {
		return nil
	}
	err := n.f.Close()
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}
