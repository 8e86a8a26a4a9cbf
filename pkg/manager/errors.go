package manager

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"unicode/utf8"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// The manager's error vocabulary. Every error an operation returns wraps
// exactly one of these, so transports map them to their own names in one
// place (the D-Bus layer: dev.vgpud1.Error.<Name>). Messages say what to do
// next; the wrapped cause keeps the driver's code.
var (
	ErrNotFound        = errors.New("not found")
	ErrInvalidArgument = errors.New("invalid argument")
	ErrQuotaExceeded   = errors.New("quota exceeded")
	ErrNoCapacity      = errors.New("no capacity")
	ErrAccessDenied    = errors.New("access denied")
	ErrBusy            = errors.New("busy")
	ErrConflict        = errors.New("conflict")
	ErrGPULost         = errors.New("GPU lost")
	ErrBackendFailure  = errors.New("backend failure")
	// ErrStaleClaim: a fleet scheduler's allocation (placement-consumer)
	// names room this host no longer has, or was deleted while its create
	// ran. The scheduler deletes its allocation and tries its next
	// candidate. Errors wrapping it usually wrap ErrNoCapacity too; Name
	// reports StaleClaim.
	ErrStaleClaim = errors.New("stale claim")
)

// Name returns the sentinel's short name ("QuotaExceeded"), the suffix of
// the D-Bus error name; "BackendFailure" for anything else.
func Name(err error) string {
	switch {
	case errors.Is(err, ErrStaleClaim):
		// Before NotFound and NoCapacity, which a stale claim may wrap.
		return "StaleClaim"
	case errors.Is(err, ErrNotFound):
		return "NotFound"
	case errors.Is(err, ErrInvalidArgument):
		return "InvalidArgument"
	case errors.Is(err, ErrQuotaExceeded):
		return "QuotaExceeded"
	case errors.Is(err, ErrNoCapacity):
		return "NoCapacity"
	case errors.Is(err, ErrAccessDenied):
		return "AccessDenied"
	case errors.Is(err, ErrBusy):
		return "Busy"
	case errors.Is(err, ErrConflict):
		return "Conflict"
	case errors.Is(err, ErrGPULost):
		return "GPULost"
	default:
		return "BackendFailure"
	}
}

// opError is what operations return: a sentinel, the user-facing message
// and the internal cause.
type opError struct {
	kind  error
	msg   string
	cause error
	// shown: the cause's text is part of msg (it is meant for users).
	shown bool
}

func (e *opError) Error() string {
	if e.cause != nil && !e.shown {
		return e.msg + ": " + e.cause.Error()
	}
	return e.msg
}

func (e *opError) Unwrap() []error {
	if e.cause != nil {
		return []error{e.kind, e.cause}
	}
	return []error{e.kind}
}

// Message is the part meant for users: what failed and what to do next,
// without the internal cause.
//
// A backend failure also carries its cause (the file system is full, the
// driver answered ERROR_UNKNOWN, libvirt's reason): for those the cause is
// what the operator acts on, so it is part of the message, cut to a
// readable length.
func Message(err error) string {
	var oe *opError
	if errors.As(err, &oe) {
		if errors.Is(oe.kind, ErrBackendFailure) && oe.cause != nil && !oe.shown {
			return oe.msg + ": " + causeText(oe.cause)
		}
		return oe.msg
	}
	return err.Error()
}

// maxCause bounds the cause's text in a message.
const maxCause = 512

// causeText is a backend failure's cause as users read it: its text, and
// for the system errors an operator fixes on the host, what to do.
func causeText(err error) string {
	msg := err.Error()
	if len(msg) > maxCause {
		cut := maxCause
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…"
	}
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		msg += " (the file system is full: free space on it, then retry)"
	case errors.Is(err, syscall.EROFS):
		msg += " (the file system is read-only: remount it read-write, then retry)"
	case errors.Is(err, syscall.EIO):
		msg += " (an I/O error: check the disk and the kernel log)"
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		msg += " (permission denied: vgpud runs as root with CAP_SYS_ADMIN; check the unit's sandboxing)"
	}
	return msg
}

func fail(kind error, cause error, format string, args ...any) error {
	return &opError{kind: kind, msg: fmt.Sprintf(format, args...), cause: cause}
}

// failShown is fail for causes whose text users should read (quota and
// placement refusals say what is left instead).
func failShown(kind error, cause error, msg string) error {
	return &opError{kind: kind, msg: msg + ": " + cause.Error(), cause: cause, shown: true}
}

// classify turns a backend, store, tenant or placement error into the
// manager's vocabulary, keeping it as the cause.
func classify(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	var oe *opError
	if errors.As(err, &oe) {
		return err
	}
	msg := fmt.Sprintf(format, args...)
	switch {
	case errors.Is(err, gpu.ErrGPULost):
		return fail(ErrGPULost, err, "%s: the GPU fell off the bus; its instances are marked lost until it returns", msg)
	case errors.Is(err, gpu.ErrInUse):
		return fail(ErrBusy, err, "%s: the device is in use; stop the VM using it and retry", msg)
	case errors.Is(err, gpu.ErrExists):
		// The cause says where the device is.
		return failShown(ErrConflict, err, msg+" (a device vgpud did not create has its identity, and vgpud leaves it alone: give another UUID, or remove that device first)")
	case errors.Is(err, gpu.ErrNoResources):
		return fail(ErrNoCapacity, err, "%s: the driver has no room; run `vgpuctl capacity` to see what fits", msg)
	case errors.Is(err, gpu.ErrResetRequired):
		return fail(ErrBusy, err, "%s: the change is pending until the GPU is reset (stop its clients, disable its VFs, then nvidia-smi -r)", msg)
	case errors.Is(err, gpu.ErrNotSupported):
		return fail(ErrInvalidArgument, err, "%s: not supported by this GPU in its current mode", msg)
	case errors.Is(err, gpu.ErrResetting):
		return fail(ErrBusy, err, "%s: a GPU reset holds the driver session; retry when it is done", msg)
	case errors.Is(err, gpu.ErrTimeout) && errors.Is(err, context.Canceled):
		return fail(ErrBackendFailure, err, "%s: cancelled before the driver answered; vgpud reconciles the device on its next pass", msg)
	case errors.Is(err, gpu.ErrTimeout):
		return fail(ErrBackendFailure, err, "%s: the driver did not answer in time; vgpud reconciles the device on its next pass", msg)
	case errors.Is(err, gpu.ErrDriverNotLoaded):
		return fail(ErrBackendFailure, err, "%s: the NVIDIA driver is not loaded", msg)
	case errors.Is(err, store.ErrNotFound):
		return fail(ErrNotFound, err, "%s", msg)
	case errors.Is(err, store.ErrConflict):
		return fail(ErrConflict, err, "%s: the record changed meanwhile; retry", msg)
	case errors.Is(err, store.ErrInUse):
		return fail(ErrBusy, err, "%s: it is still in use (an instance was added meanwhile); retry", msg)
	case errors.Is(err, tenant.ErrQuotaExceeded):
		return failShown(ErrQuotaExceeded, err, msg)
	case errors.Is(err, tenant.ErrNotAllowed):
		// The tenant's allow-list refuses the profile: a request the tenant
		// may not make, not a caller without rights (AccessDenied).
		return failShown(ErrInvalidArgument, err, msg)
	case errors.Is(err, tenant.ErrInvalidName), errors.Is(err, tenant.ErrInvalidQuantity), errors.Is(err, tenant.ErrInvalidTenant):
		return failShown(ErrInvalidArgument, err, msg)
	case errors.Is(err, placement.ErrUnknownProfile):
		return failShown(ErrInvalidArgument, err, msg)
	case errors.Is(err, placement.ErrNoSuchGPU):
		return failShown(ErrNotFound, err, msg)
	case errors.Is(err, placement.ErrNoCapacity):
		return failShown(ErrNoCapacity, err, msg)
	case errors.Is(err, gpu.ErrInvalid):
		return fail(ErrInvalidArgument, err, "%s", msg)
	case errors.Is(err, gpu.ErrNotFound):
		return fail(ErrNotFound, err, "%s", msg)
	}
	return fail(ErrBackendFailure, err, "%s", msg)
}

// noModel is the failure of an operation on a record whose GPU model the
// catalog in force no longer has: a reload dropped it (a profiles.d file
// removed), while the record was admitted under a catalog that had it.
func noModel(r store.Instance) error {
	return fail(ErrBackendFailure, nil, "instance %s: GPU model %s is not in the catalog vgpud runs with; restore its file in /etc/vgpud/profiles.d and reload (systemctl reload vgpud)", r.UUID, r.Model)
}
