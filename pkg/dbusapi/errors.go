package dbusapi

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/godbus/dbus/v5"

	"github.com/vgpud/vgpud/pkg/manager"
)

// Error names: each daemon error is ErrorPrefix + one of these, mapped 1:1
// from the manager's sentinel errors.
const (
	NameQuotaExceeded   = "QuotaExceeded"
	NameNoCapacity      = "NoCapacity"
	NameNotFound        = "NotFound"
	NameInvalidArgument = "InvalidArgument"
	NameAccessDenied    = "AccessDenied"
	NameBusy            = "Busy"
	NameConflict        = "Conflict"
	NameGPULost         = "GPULost"
	NameBackendFailure  = "BackendFailure"
	// NameStaleClaim: a fleet scheduler's allocation (placement-consumer)
	// names room the host no longer has, or was deleted while the create
	// ran; the scheduler deletes its allocation and tries its next
	// candidate.
	NameStaleClaim = "StaleClaim"

	// The client reports these two itself; the daemon sends Unavailable
	// only from GetFleetStatus (no fleet configured, Placement down), and
	// Timeout only for an operation the caller's deadline or Cancel cut off
	// (cancelled), so the name does not depend on whose timer fired first.

	// NameUnavailable: the bus, vgpud or the part of it asked for cannot
	// be reached.
	NameUnavailable = "Unavailable"
	// NameTimeout: the caller's deadline passed before vgpud answered.
	NameTimeout = "Timeout"
)

// ErrorNames lists the daemon's error names (without ErrorPrefix).
var ErrorNames = []string{
	NameQuotaExceeded, NameNoCapacity, NameNotFound, NameInvalidArgument, NameAccessDenied,
	NameBusy, NameConflict, NameGPULost, NameBackendFailure, NameStaleClaim,
}

// toDBusError is the one place an error becomes a D-Bus error: the name
// from its manager sentinel (manager.Name), the body its user-facing
// message (what failed and what to do next; for a backend failure also
// its cause, see manager.Message). Other internal causes stay in the
// daemon's log. Errors this package makes itself (apiError) carry a
// sentinel too, so every name comes from here.
func toDBusError(err error) *dbus.Error {
	var de *dbus.Error
	if errors.As(err, &de) {
		return de
	}
	msg := manager.Message(err)
	var ae *apiError
	if errors.As(err, &ae) {
		msg = ae.msg
	}
	return &dbus.Error{Name: ErrorPrefix + manager.Name(err), Body: []any{msg}}
}

// apiError is an error the D-Bus layer makes itself (a refusal it decides,
// or a manager error it words anew): kind wraps a manager sentinel, msg is
// what users read, cause (nil when none) goes to the log only.
type apiError struct {
	kind  error
	msg   string
	cause error
}

func (e *apiError) Error() string {
	if e.cause != nil {
		return e.msg + ": " + e.cause.Error()
	}
	return e.msg
}

func (e *apiError) Unwrap() []error {
	if e.cause != nil {
		return []error{e.kind, e.cause}
	}
	return []error{e.kind}
}

// apiErr is the D-Bus error of a refusal this package decides itself,
// named by its sentinel like the manager's own errors.
func apiErr(kind error, format string, args ...any) *dbus.Error {
	return toDBusError(&apiError{kind: kind, msg: fmt.Sprintf(format, args...)})
}

func invalidArg(format string, args ...any) *dbus.Error {
	return apiErr(manager.ErrInvalidArgument, format, args...)
}

// Error is what the client returns for a failed call: a short error name
// (one of the Name constants, or the foreign D-Bus error name) and a
// message meant for users, which says what to do next.
type Error struct {
	Name    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Is matches errors by name: errors.Is(err, &dbusapi.Error{Name: dbusapi.NameNotFound}).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Name == e.Name && (t.Message == "" || t.Message == e.Message)
}

// ErrorName returns the error name of err ("NotFound", ...), "" for nil and
// NameBackendFailure for errors that are not *Error.
func ErrorName(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Name
	}
	return NameBackendFailure
}

// fromDBus turns what a call returned into an *Error users can read:
// vgpud's named errors keep their name and message; the bus's own errors
// are translated into what they mean for a vgpud user.
func fromDBus(ctx context.Context, what string, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	if ctx.Err() != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return &Error{Name: NameTimeout, Message: fmt.Sprintf("%s: vgpud did not answer in time; the operation may still finish (check with `vgpuctl list`), or retry with a longer --timeout", what)}
		}
		return &Error{Name: NameTimeout, Message: what + ": cancelled; vgpud was asked to cancel the operation and undoes what it started"}
	}
	var de dbus.Error
	var dep *dbus.Error
	switch {
	case errors.As(err, &dep):
		de = *dep
	case errors.As(err, &de):
	default:
		return &Error{Name: NameUnavailable, Message: fmt.Sprintf("%s: the bus connection failed (%v); is dbus running and vgpud started (systemctl status vgpud)?", what, err)}
	}
	msg := ""
	if len(de.Body) > 0 {
		if s, ok := de.Body[0].(string); ok {
			msg = s
		}
	}
	if name, ok := strings.CutPrefix(de.Name, ErrorPrefix); ok {
		if msg == "" {
			msg = what + ": " + name
		}
		return &Error{Name: name, Message: msg}
	}
	switch de.Name {
	case "org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner":
		return &Error{Name: NameUnavailable, Message: what + ": vgpud is not running on this bus (nobody owns " + BusName + "); start it with `systemctl start vgpud`, or pick its bus with --connect"}
	case "org.freedesktop.systemd1.NoSuchUnit":
		// D-Bus activation asked systemd for the unit's alias, which only
		// an enabled vgpud.service has.
		return &Error{Name: NameUnavailable, Message: what + ": vgpud is not running, and the bus cannot start it because vgpud.service is not enabled; run `systemctl enable --now vgpud`"}
	case "org.freedesktop.DBus.Error.AccessDenied":
		return &Error{Name: NameAccessDenied, Message: what + ": the bus policy refused the call; install systemd/dbus-1/dev.vgpud1.conf into /usr/share/dbus-1/system.d and reload dbus"}
	case "org.freedesktop.DBus.Error.NoReply":
		// dbus-daemon answers NoReply both when its own reply timeout
		// passes and when the callee left the bus mid-call (it stopped
		// or was killed): the latter is vgpud being unreachable.
		if strings.Contains(strings.ToLower(msg), "disconnected") {
			return &Error{Name: NameUnavailable, Message: what + ": vgpud left the bus before it answered (it stopped or was killed); its next start resolves the operation; check `systemctl status vgpud`"}
		}
		return &Error{Name: NameTimeout, Message: what + ": vgpud did not answer in time; retry, or check `systemctl status vgpud`"}
	case "org.freedesktop.DBus.Error.Timeout", "org.freedesktop.DBus.Error.TimedOut":
		return &Error{Name: NameTimeout, Message: what + ": vgpud did not answer in time; retry, or check `systemctl status vgpud`"}
	case "org.freedesktop.DBus.Error.Disconnected":
		return &Error{Name: NameUnavailable, Message: what + ": the bus connection closed; is vgpud restarting? Retry"}
	case "org.freedesktop.DBus.Error.UnknownObject":
		return &Error{Name: NameNotFound, Message: what + ": no such object"}
	case "org.freedesktop.DBus.Error.UnknownMethod", "org.freedesktop.DBus.Error.UnknownInterface", "org.freedesktop.DBus.Error.InvalidArgs":
		return &Error{Name: NameBackendFailure, Message: what + ": this vgpud does not speak this client's API; update vgpuctl and vgpud together"}
	}
	if msg == "" {
		msg = "the bus answered with an error vgpuctl does not know; check `systemctl status vgpud` and that vgpuctl and vgpud are of the same release"
	}
	return &Error{Name: NameBackendFailure, Message: what + ": " + msg}
}
