package dbusapi

import (
	"context"
	"testing"

	"github.com/godbus/dbus/v5"
)

// A daemon that leaves the bus during a call (killed) is unreachable, not
// slow: dbus-daemon's NoReply says "disconnected" then.
func TestNoReplyFromADeadDaemonIsUnavailable(t *testing.T) {
	for _, c := range []struct {
		body, want string
	}{
		{"Message recipient disconnected from message bus without replying", NameUnavailable},
		{"Did not receive a reply. Possible causes include: the remote application did not send a reply", NameTimeout},
	} {
		err := fromDBus(context.Background(), "create", dbus.Error{Name: "org.freedesktop.DBus.Error.NoReply", Body: []any{c.body}})
		if got := ErrorName(err); got != c.want {
			t.Errorf("NoReply %q: %s (%v), want %s", c.body, got, err, c.want)
		}
	}
}
