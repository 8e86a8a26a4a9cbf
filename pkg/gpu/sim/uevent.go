package sim

import (
	"sort"
	"time"
)

// Uevent is a kobject uevent the simulated kernel emitted, as a netlink
// listener would receive it.
type Uevent struct {
	Seq       uint64            `json:"seq"`
	Action    string            `json:"action"`
	DevPath   string            `json:"devpath"`
	Subsystem string            `json:"subsystem"`
	Env       map[string]string `json:"env,omitempty"`
	UnixNano  int64             `json:"t"`
}

// maxUevents bounds the uevent ring kept in state.json.
const maxUevents = 1024

func (st *state) uevent(action, devpath, subsystem string, env map[string]string) {
	st.NextUevent++
	st.Uevents = append(st.Uevents, Uevent{Seq: st.NextUevent, Action: action, DevPath: "/" + devpath,
		Subsystem: subsystem, Env: env, UnixNano: time.Now().UnixNano()})
	if len(st.Uevents) > maxUevents {
		st.Uevents = st.Uevents[len(st.Uevents)-maxUevents:]
	}
}

// UeventsSince returns the uevents after sequence number after, and the
// newest sequence number. The ring is in sequence order, so the first one
// to return is found by binary search.
func (h *Host) UeventsSince(after uint64) ([]Uevent, uint64, error) {
	var out []Uevent
	var last uint64
	err := h.view(func(st *state) error {
		last = st.NextUevent
		i := sort.Search(len(st.Uevents), func(i int) bool { return st.Uevents[i].Seq > after })
		if i < len(st.Uevents) {
			out = append([]Uevent(nil), st.Uevents[i:]...)
		}
		return nil
	})
	return out, last, err
}

// EmitUevent queues a uevent (tests use it to simulate storms and hotplug).
func (h *Host) EmitUevent(action, devpath, subsystem string, env map[string]string) error {
	return h.mutate(func(st *state) (bool, error) {
		st.uevent(action, devpath, subsystem, env)
		return true, nil
	})
}
