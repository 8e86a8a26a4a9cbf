package main

import (
	"log/slog"
	"time"

	sd "github.com/coreos/go-systemd/v22/daemon"
)

// notifier talks to systemd's notify socket ($NOTIFY_SOCKET); without one
// (not under systemd) every call is a no-op.
type notifier interface {
	// Ready sends READY=1 with a status line: only after reconcile.
	Ready(status string)
	Status(status string)
	// Stopping sends STOPPING=1.
	Stopping()
	// Watchdog sends WATCHDOG=1.
	Watchdog()
	// WatchdogInterval is $WATCHDOG_USEC, and whether the watchdog is on.
	WatchdogInterval() (time.Duration, bool)
}

type sdNotifier struct{ log *slog.Logger }

func newNotifier(log *slog.Logger) notifier { return sdNotifier{log: log.With("component", "systemd")} }

func (n sdNotifier) send(state string) {
	if _, err := sd.SdNotify(false, state); err != nil {
		n.log.Warn("sd_notify", "state", state, "err", err)
	}
}

func (n sdNotifier) Ready(status string) { n.send(sd.SdNotifyReady + "\nSTATUS=" + status) }
func (n sdNotifier) Status(s string)     { n.send("STATUS=" + s) }
func (n sdNotifier) Stopping()           { n.send(sd.SdNotifyStopping + "\nSTATUS=stopping") }
func (n sdNotifier) Watchdog()           { n.send(sd.SdNotifyWatchdog) }

func (n sdNotifier) WatchdogInterval() (time.Duration, bool) {
	d, err := sd.SdWatchdogEnabled(false)
	if err != nil || d == 0 {
		return 0, false
	}
	return d, true
}
