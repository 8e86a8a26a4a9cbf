package sim

import (
	"strconv"

	"github.com/vgpud/vgpud/pkg/uevent"
)

// UeventSource opens a uevent.Source over the simulated kernel's uevent
// ring, as uevent.OpenNetlink opens one over the real kernel's: the daemon
// reads both the same way. It starts after the newest uevent and wakes at
// every change of the host (Changed), so an event is read as soon as any
// process sharing the host emits it.
//
// It lives here rather than in pkg/uevent, which stays free of vgpud's
// packages: the simulator provides its uevents the way it provides its
// NVML (NVML) and its sysfs (FS), through the real one's interface.
func (h *Host) UeventSource() (uevent.Source, error) {
	p, err := uevent.NewWakingPoller(h.fetchUevents, h.Changed)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// fetchUevents is UeventsSince as a uevent.FetchFunc: each event carries
// the keys the kernel puts in every uevent (ACTION, DEVPATH, SUBSYSTEM,
// SEQNUM) in its Env, as Parse reads them from a netlink datagram.
func (h *Host) fetchUevents(after uint64) ([]uevent.Event, uint64, error) {
	us, newest, err := h.UeventsSince(after)
	if err != nil {
		return nil, 0, err
	}
	out := make([]uevent.Event, len(us))
	for i, u := range us {
		env := map[string]string{"ACTION": u.Action, "DEVPATH": u.DevPath, "SUBSYSTEM": u.Subsystem, "SEQNUM": strconv.FormatUint(u.Seq, 10)}
		for k, v := range u.Env {
			env[k] = v
		}
		out[i] = uevent.Event{Action: uevent.Action(u.Action), DevPath: u.DevPath, Subsystem: u.Subsystem, Seq: u.Seq, Env: env}
	}
	return out, newest, nil
}
