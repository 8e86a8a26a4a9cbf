package testenv

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// NotifySocket is the service manager's end of $NOTIFY_SOCKET: it
// collects the sd_notify messages a daemon sends, in order.
type NotifySocket struct {
	t    testing.TB
	path string
	conn *net.UnixConn

	mu   sync.Mutex
	msgs []NotifyMsg
	cond chan struct{} // closed and replaced on every message
	// onMsg runs in the reader for each message, before waiters see it;
	// its result is kept as the message's Snap.
	onMsg func(NotifyMsg) string
}

// NotifyMsg is one message: its KEY=VALUE lines.
type NotifyMsg struct {
	At     time.Time
	Fields map[string]string
	// Snap is what the OnMsg function returned for it (a picture of the
	// host at the moment a state arrived).
	Snap string
}

// Has says whether the message sets KEY=VALUE kv.
func (m NotifyMsg) Has(kv string) bool {
	k, v, _ := strings.Cut(kv, "=")
	got, ok := m.Fields[k]
	return ok && got == v
}

// ListenNotify opens a unixgram socket for a daemon's notifications; the
// daemon is pointed at Path (NOTIFY_SOCKET) by the caller.
func ListenNotify(t testing.TB) *NotifySocket {
	t.Helper()
	// Socket paths are limited to 108 bytes; test temp dirs can be longer.
	dir, err := os.MkdirTemp("", "sdn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	n := &NotifySocket{t: t, path: filepath.Join(dir, "notify"), cond: make(chan struct{})}
	n.conn, err = net.ListenUnixgram("unixgram", &net.UnixAddr{Name: n.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.conn.Close() })
	go n.read()
	return n
}

// Path is the socket's path, the value of $NOTIFY_SOCKET.
func (n *NotifySocket) Path() string { return n.path }

func (n *NotifySocket) read() {
	buf := make([]byte, 4096)
	for {
		k, err := n.conn.Read(buf)
		if err != nil {
			return
		}
		m := NotifyMsg{At: time.Now(), Fields: map[string]string{}}
		for _, line := range strings.Split(string(buf[:k]), "\n") {
			if a, b, ok := strings.Cut(line, "="); ok {
				m.Fields[a] = b
			}
		}
		n.mu.Lock()
		hook := n.onMsg
		n.mu.Unlock()
		if hook != nil {
			m.Snap = hook(m)
		}
		n.mu.Lock()
		n.msgs = append(n.msgs, m)
		close(n.cond)
		n.cond = make(chan struct{})
		n.mu.Unlock()
	}
}

// OnMsg sets the function run for each later message as it arrives.
func (n *NotifySocket) OnMsg(fn func(NotifyMsg) string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.onMsg = fn
}

// Await returns the first message from index from on matching pred, and
// its index; it fails the test when none comes within timeout.
func (n *NotifySocket) Await(what string, from int, timeout time.Duration, pred func(NotifyMsg) bool) (NotifyMsg, int) {
	n.t.Helper()
	deadline := time.After(timeout)
	for i := from; ; {
		n.mu.Lock()
		for ; i < len(n.msgs); i++ {
			if pred(n.msgs[i]) {
				m := n.msgs[i]
				n.mu.Unlock()
				return m, i
			}
		}
		c := n.cond
		n.mu.Unlock()
		select {
		case <-c:
		case <-deadline:
			var all []map[string]string
			for _, m := range n.Between(from, n.Count()) {
				all = append(all, m.Fields)
			}
			n.t.Fatalf("no notify message %s within %v; got %v", what, timeout, all)
		}
	}
}

// Between is the messages from index from up to (not including) to, or
// up to the last one when fewer have come.
func (n *NotifySocket) Between(from, to int) []NotifyMsg {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]NotifyMsg(nil), n.msgs[from:min(to, len(n.msgs))]...)
}

// Count is how many messages have come.
func (n *NotifySocket) Count() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.msgs)
}
