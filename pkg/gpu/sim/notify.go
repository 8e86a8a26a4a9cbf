package sim

import (
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Change notification. The real driver wakes a thread blocked in
// nvmlEventSetWait when an event arrives, and the kernel a netlink reader
// when it sends a uevent; nothing polls. The simulator does the same:
// every change of the state wakes whoever waits for one, whether this
// process made it (mutate) or another one did (`vgpud sim xid` writes
// state.json: an inotify watch on the host's directory sees its rename).

// notifier hands out a channel that is closed at the next change.
type notifier struct {
	mu sync.Mutex
	ch chan struct{}
	// watch is the inotify file of the host's directory; nil until the
	// first waiter, or when inotify is unavailable (waiters then see
	// other processes' changes only when their own timeout re-reads the
	// state).
	watch   *os.File
	started bool
	closed  bool
}

// Changed returns a channel that is closed at the next change of the
// simulated host's state, by this process or another one sharing the
// host's directory. A waiter takes the channel before it reads the state,
// so that a change between the read and the wait is not missed.
func (h *Host) Changed() <-chan struct{} {
	n := &h.notify
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.started && !n.closed {
		n.started = true
		n.watch = h.watchDir()
	}
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

// changed wakes the waiters.
func (h *Host) changed() {
	n := &h.notify
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
}

// watchDir starts reading inotify events for the host's directory: a
// writer replaces state.json by rename (save), so IN_MOVED_TO is every
// committed change. It returns nil when inotify is unavailable.
func (h *Host) watchDir() *os.File {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		h.log.Debug("inotify unavailable: changes by other processes are seen at the next read", "err", err)
		return nil
	}
	if _, err := unix.InotifyAddWatch(fd, h.dir, unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		h.log.Debug("inotify unavailable: changes by other processes are seen at the next read", "err", err)
		return nil
	}
	// A non-blocking descriptor goes to the runtime's poller: the reader
	// sleeps without a thread, and Close wakes it.
	f := os.NewFile(uintptr(fd), "inotify:"+h.dir)
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := f.Read(buf); err != nil {
				return
			}
			h.changed()
		}
	}()
	return f
}

// closeNotify ends the directory watch and wakes the waiters.
func (h *Host) closeNotify() {
	n := &h.notify
	n.mu.Lock()
	n.closed = true
	w := n.watch
	n.watch = nil
	n.mu.Unlock()
	if w != nil {
		w.Close()
	}
	h.changed()
}
