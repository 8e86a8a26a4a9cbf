package main

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	sd "github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/sys/unix"
)

// notifier talks to systemd's notify socket ($NOTIFY_SOCKET); without one
// (not under systemd) every call is a no-op. The unit is Type=notify:
// systemd orders libvirtd and its VM autostart after READY=1, so READY=1
// is sent only once start-up reconcile has put every instance back.
type notifier interface {
	// Ready sends READY=1 with a status line: only after reconcile (and
	// again after a reload).
	Ready(status string)
	// Status sends STATUS= (what `systemctl status` shows); an unchanged
	// line is not sent again.
	Status(status string)
	// Stopping sends STOPPING=1: SIGTERM arrived, the operations in flight
	// are being finished and no new one is accepted.
	Stopping()
	// Reloading sends RELOADING=1 (SIGHUP); Ready ends the reload.
	Reloading()
	// Watchdog sends WATCHDOG=1.
	Watchdog()
	// ExtendTimeout asks systemd for d more before it gives up on the
	// start (EXTEND_TIMEOUT_USEC=): waiting for the driver at boot may
	// outlast TimeoutStartSec.
	ExtendTimeout(d time.Duration)
	// WatchdogInterval is $WATCHDOG_USEC, and whether the watchdog is on.
	WatchdogInterval() (time.Duration, bool)
}

type sdNotifier struct {
	log *slog.Logger

	mu         sync.Mutex
	lastStatus string
}

func newNotifier(log *slog.Logger) notifier {
	return &sdNotifier{log: log.With("component", "systemd")}
}

func (n *sdNotifier) send(state string) {
	if _, err := sd.SdNotify(false, state); err != nil {
		n.log.Warn("sd_notify", "state", state, "err", err)
	}
}

// sendStatus sends state with STATUS=status appended; force sends even an
// unchanged status (READY, STOPPING and RELOADING must go out).
func (n *sdNotifier) sendStatus(state, status string, force bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !force && status == n.lastStatus {
		return
	}
	n.lastStatus = status
	msg := "STATUS=" + status
	if state != "" {
		msg = state + "\n" + msg
	}
	n.send(msg)
}

func (n *sdNotifier) Ready(status string) { n.sendStatus(sd.SdNotifyReady, status, true) }
func (n *sdNotifier) Status(s string)     { n.sendStatus("", s, false) }
func (n *sdNotifier) Stopping() {
	n.sendStatus(sd.SdNotifyStopping, "stopping: finishing operations in flight, accepting no new ones", true)
}
func (n *sdNotifier) Watchdog() { n.send(sd.SdNotifyWatchdog) }

func (n *sdNotifier) Reloading() {
	// MONOTONIC_USEC lets systemd (253+, Type=notify-reload) tell this
	// reload from an earlier one; older versions ignore it.
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	n.sendStatus(fmt.Sprintf("%s\nMONOTONIC_USEC=%d", sd.SdNotifyReloading, ts.Nano()/1000), "reloading configuration", true)
}

func (n *sdNotifier) ExtendTimeout(d time.Duration) {
	n.send(fmt.Sprintf("EXTEND_TIMEOUT_USEC=%d", d.Microseconds()))
}

func (n *sdNotifier) WatchdogInterval() (time.Duration, bool) {
	d, err := sd.SdWatchdogEnabled(false)
	if err != nil || d == 0 {
		return 0, false
	}
	return d, true
}
