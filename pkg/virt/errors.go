package virt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/digitalocean/go-libvirt"
)

// Sentinel errors. Every error this package returns for one of these cases
// wraps the sentinel (test with errors.Is) and, where libvirt said why, a
// *LibvirtError with libvirt's code and message (errors.As).
var (
	// ErrDomainNotFound: no domain of that name on this connection's host.
	ErrDomainNotFound = errors.New("domain not found")
	// ErrOtherHost: the domain reference names a libvirt URI other than the
	// one this connection serves. Nothing was sent to libvirtd.
	ErrOtherHost = errors.New("domain is on another libvirt host")
	// ErrAttachedElsewhere: another domain's config or live definition holds
	// a hostdev with the same mdev UUID or PCI address, or its vgpud metadata
	// names the same instance.
	ErrAttachedElsewhere = errors.New("host device is attached to another domain")
	// ErrUnreachable: no connection to libvirtd could be made within the
	// timeout.
	ErrUnreachable = errors.New("libvirtd unreachable")
	// ErrLiveAttach: the domain runs and libvirt refused the live attach. The
	// persistent config and the metadata are unchanged.
	ErrLiveAttach = errors.New("live attach failed")
	// ErrLiveDetach: libvirt refused the live detach or reported that the
	// guest did not release the device. The config is unchanged.
	ErrLiveDetach = errors.New("live detach failed")
	// ErrTimeout: a call to libvirtd, or the wait for the guest to release a
	// device, did not finish in time. The outcome of a change that was under
	// way is unknown; repeating the same call is safe.
	ErrTimeout = errors.New("libvirt operation timed out")
	// ErrInvalidHostdev: the Hostdev value is malformed (bad UUID or PCI
	// address, options that its kind does not have).
	ErrInvalidHostdev = errors.New("invalid host device")
	// ErrNotPersistent: the domain is transient, so it has no persistent
	// config to attach to.
	ErrNotPersistent = errors.New("domain has no persistent configuration")
	// ErrNeedsGraphics: a display-enabled mdev needs a <graphics> device in
	// the domain (libvirt refuses display='on' without one).
	ErrNeedsGraphics = errors.New("display needs a graphics device in the domain")
	// ErrClosed: the Conn was closed.
	ErrClosed = errors.New("libvirt connection closed")
)

// LibvirtError is an error libvirtd returned, with its virErrorNumber code
// and libvirt's own message. It wraps go-libvirt's libvirt.Error, so
// errors.As finds either.
type LibvirtError struct {
	Code    int
	Message string
	raw     libvirt.Error
}

func (e *LibvirtError) Error() string {
	return fmt.Sprintf("libvirt error %d: %s", e.Code, e.Message)
}

// Unwrap is go-libvirt's error as libvirtd sent it.
func (e *LibvirtError) Unwrap() error { return e.raw }

// libvirtErr maps an error from go-libvirt onto this package's errors by
// libvirt's numeric code, never by message text. Errors that are not from
// libvirtd pass through.
func libvirtErr(err error) error {
	var le libvirt.Error
	if !errors.As(err, &le) {
		return err
	}
	e := &LibvirtError{Code: int(le.Code), Message: le.Message, raw: le}
	switch libvirt.ErrorNumber(le.Code) {
	case libvirt.ErrNoDomain:
		return fmt.Errorf("%w: %w", ErrDomainNotFound, e)
	case libvirt.ErrOperationTimeout:
		return fmt.Errorf("%w: %w", ErrTimeout, e)
	}
	return e
}

// refused reports whether libvirtd answered with an error, as opposed to the
// call not getting an answer (broken connection, timeout).
func refused(err error) bool {
	var e *LibvirtError
	return errors.As(err, &e)
}

// isConnErr reports whether err means the connection to libvirtd broke (so
// the operation is repeated on a new one) rather than libvirtd answering
// with an error.
func isConnErr(err error) bool {
	if err == nil {
		return false
	}
	var le libvirt.Error
	if errors.As(err, &le) {
		return false
	}
	var lve *LibvirtError
	if errors.As(err, &lve) {
		return false
	}
	return errors.Is(err, libvirt.ErrInterrupted) ||
		errors.Is(err, syscall.EINVAL) || // go-libvirt: send on a closed socket
		errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed)
}

// ctxErr is the error for a call abandoned because ctx ended.
func ctxErr(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrTimeout, ctx.Err())
	}
	return ctx.Err()
}
