// Package uevent reads kobject uevents: the kernel's notices that a device
// was added, removed, bound to or unbound from a driver, or changed. vgpud
// follows the PCI functions of its GPUs (physical functions and SR-IOV
// virtual functions) and the mediated devices carved from them, so that a
// GPU that leaves the bus, VFs that appear late at boot, or an mdev removed
// behind vgpud's back are noticed without waiting for the next periodic scan.
//
// A Source delivers events one at a time. Netlink reads the kernel's
// NETLINK_KOBJECT_UEVENT multicast group; Poller reads any producer that
// numbers its events (the simulated host keeps a ring of the uevents its
// simulated kernel emitted). Parse decodes the kernel's wire format, which
// both share.
//
// It imports nothing from vgpud; cmd/vgpud, pkg/health and pkg/gpu/sim (whose
// UeventSource is a Poller over its ring) import it.
//
// Imports: nothing from vgpud.
package uevent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Action is what happened to the device.
type Action string

// The kernel's actions (lib/kobject_uevent.c).
const (
	Add     Action = "add"
	Remove  Action = "remove"
	Change  Action = "change"
	Move    Action = "move"
	Online  Action = "online"
	Offline Action = "offline"
	Bind    Action = "bind"
	Unbind  Action = "unbind"
)

// Errors a Source or Parse returns.
var (
	// ErrMalformed: a message is not a kernel uevent (no ACTION@DEVPATH
	// header, a header that contradicts its ACTION=/DEVPATH= keys, a bad
	// SEQNUM). The source stays usable.
	ErrMalformed = errors.New("malformed uevent")
	// ErrNotKernel: the message came from user space (udevd's re-broadcast,
	// which starts with "libudev"), not from the kernel. Sources skip these.
	ErrNotKernel = errors.New("not a kernel uevent")
	// ErrOverflow: events were lost since the previous Next (the socket's
	// receive buffer overflowed during a storm, or a poller fell behind its
	// producer's ring). The source stays usable; the caller must re-read
	// whatever state it follows instead of relying on the missed events.
	ErrOverflow = errors.New("uevents were lost")
	// ErrClosed: Next on a closed source.
	ErrClosed = errors.New("uevent source closed")
)

// Event is one uevent.
type Event struct {
	Action Action
	// DevPath is the device's path below /sys, starting with "/"
	// ("/devices/pci0000:40/0000:40:01.1/0000:41:00.0").
	DevPath string
	// Subsystem is SUBSYSTEM= ("pci", "mdev", ...).
	Subsystem string
	// Seq is SEQNUM=, the kernel's uevent sequence number (0 if absent).
	Seq uint64
	// Env holds every KEY=VALUE pair of the message, ACTION, DEVPATH,
	// SUBSYSTEM and SEQNUM included.
	Env map[string]string
}

// Name is the device's kernel name, the last element of DevPath: the PCI
// address of a PCI function ("0000:41:00.0"), the UUID of an mdev.
func (e Event) Name() string {
	p := strings.TrimRight(e.DevPath, "/")
	return p[strings.LastIndexByte(p, '/')+1:]
}

// Driver is DRIVER= (set on bind, and on other events of a bound device).
func (e Event) Driver() string { return e.Env["DRIVER"] }

// String is a one-line description for logs.
func (e Event) String() string {
	return fmt.Sprintf("%s %s (%s, seq %d)", e.Action, e.DevPath, e.Subsystem, e.Seq)
}

// libudevMagic starts the messages udevd re-broadcasts to its own group.
var libudevMagic = []byte("libudev\x00")

// maxMessage bounds a message Parse accepts; the kernel's own limit is
// UEVENT_BUFFER_SIZE (2048 bytes of environment) plus the header.
const maxMessage = 64 << 10

// Parse decodes one kernel uevent message:
//
//	ACTION@DEVPATH \0 KEY=VALUE \0 KEY=VALUE \0 ...
//
// The ACTION= and DEVPATH= keys, when present, must agree with the header.
func Parse(msg []byte) (Event, error) {
	var ev Event
	if bytes.HasPrefix(msg, libudevMagic) {
		return ev, ErrNotKernel
	}
	if len(msg) > maxMessage {
		return ev, fmt.Errorf("%w: %d bytes", ErrMalformed, len(msg))
	}
	fields := bytes.Split(msg, []byte{0})
	header := string(fields[0])
	at := strings.IndexByte(header, '@')
	if at <= 0 || at == len(header)-1 {
		return ev, fmt.Errorf("%w: header %q is not ACTION@DEVPATH", ErrMalformed, clip(header))
	}
	ev.Action, ev.DevPath = Action(header[:at]), header[at+1:]
	if !validAction(string(ev.Action)) {
		return ev, fmt.Errorf("%w: action %q", ErrMalformed, clip(string(ev.Action)))
	}
	if ev.DevPath[0] != '/' {
		return ev, fmt.Errorf("%w: devpath %q does not start with /", ErrMalformed, clip(ev.DevPath))
	}
	ev.Env = map[string]string{}
	for _, f := range fields[1:] {
		if len(f) == 0 {
			continue
		}
		kv := string(f)
		eq := strings.IndexByte(kv, '=')
		if eq <= 0 {
			return ev, fmt.Errorf("%w: %q is not KEY=VALUE", ErrMalformed, clip(kv))
		}
		ev.Env[kv[:eq]] = kv[eq+1:]
	}
	if a, ok := ev.Env["ACTION"]; ok && a != string(ev.Action) {
		return ev, fmt.Errorf("%w: header action %q, ACTION=%q", ErrMalformed, clip(string(ev.Action)), clip(a))
	}
	if p, ok := ev.Env["DEVPATH"]; ok && p != ev.DevPath {
		return ev, fmt.Errorf("%w: header devpath %q, DEVPATH=%q", ErrMalformed, clip(ev.DevPath), clip(p))
	}
	ev.Env["ACTION"], ev.Env["DEVPATH"] = string(ev.Action), ev.DevPath
	ev.Subsystem = ev.Env["SUBSYSTEM"]
	if s, ok := ev.Env["SEQNUM"]; ok {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return ev, fmt.Errorf("%w: SEQNUM=%q", ErrMalformed, clip(s))
		}
		ev.Seq = n
	}
	return ev, nil
}

// validAction: the kernel's actions are short lower-case words; anything
// else in front of the '@' is not a uevent header.
func validAction(a string) bool {
	if len(a) == 0 || len(a) > 16 {
		return false
	}
	for _, c := range a {
		if c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Marshal encodes e in the kernel's wire format (for tests and tools that
// feed a Source). ACTION, DEVPATH, SUBSYSTEM and SEQNUM come from the
// fields; the other keys from Env, sorted.
func (e Event) Marshal() []byte {
	var b bytes.Buffer
	b.WriteString(string(e.Action))
	b.WriteByte('@')
	b.WriteString(e.DevPath)
	b.WriteByte(0)
	kv := func(k, v string) {
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(v)
		b.WriteByte(0)
	}
	kv("ACTION", string(e.Action))
	kv("DEVPATH", e.DevPath)
	if v, ok := e.Env["SUBSYSTEM"]; ok || e.Subsystem != "" {
		if e.Subsystem != "" || !ok {
			v = e.Subsystem
		}
		kv("SUBSYSTEM", v)
	}
	keys := make([]string, 0, len(e.Env))
	for k := range e.Env {
		switch k {
		case "ACTION", "DEVPATH", "SUBSYSTEM", "SEQNUM":
			continue
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		kv(k, e.Env[k])
	}
	// SEQNUM keeps the spelling it arrived with ("007") when it agrees
	// with Seq.
	if v, ok := e.Env["SEQNUM"]; ok {
		if n, err := strconv.ParseUint(v, 10, 64); err != nil || n != e.Seq {
			v = strconv.FormatUint(e.Seq, 10)
		}
		kv("SEQNUM", v)
	} else if e.Seq != 0 {
		kv("SEQNUM", strconv.FormatUint(e.Seq, 10))
	}
	return b.Bytes()
}

// Source delivers uevents.
type Source interface {
	// Next blocks until the next event. It returns ctx.Err() when ctx
	// ends, ErrOverflow (the source stays usable) when events were lost,
	// an error wrapping ErrMalformed for a message it could not decode (the
	// source stays usable), ErrClosed after Close, or another error when
	// the source failed.
	Next(ctx context.Context) (Event, error)
	// Close releases the source; a Next blocked in another goroutine
	// returns ErrClosed.
	Close() error
}
