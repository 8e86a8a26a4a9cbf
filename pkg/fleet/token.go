package fleet

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
)

// The token file's refusals.
var (
	// errTokenFileKind: not a regular file (a FIFO would block the read,
	// a device or directory is a mistake).
	errTokenFileKind = errors.New("fleet token file is not a regular file")
	// errTokenFileMode: readable or writable by others, as ssh refuses a
	// private key that is.
	errTokenFileMode = errors.New("fleet token file is accessible to other users")
	// errTokenFileSize: empty, or larger than any keystone token.
	errTokenFileSize = errors.New("fleet token file has no usable size")
)

// maxTokenFile bounds what is read of the token file: keystone's Fernet
// tokens are under 300 bytes, PKI ones a few KiB.
const maxTokenFile = 64 << 10

// readTokenFile reads the keystone token ("" for no file: noauth2). Only a
// regular file is read, never past maxTokenFile, and one that others may
// read or write is refused: it is a credential. It is opened without
// blocking, so a FIFO is refused at once rather than holding the reload
// (and with it the daemon's shutdown).
func readTokenFile(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("fleet token file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("fleet token file: %w", err)
	}
	switch {
	case !fi.Mode().IsRegular():
		return "", fmt.Errorf("%s (%s): %w; point fleet.tokenFile at a plain file", path, fi.Mode().Type(), errTokenFileKind)
	case fi.Mode().Perm()&0o007 != 0:
		return "", fmt.Errorf("%s has mode %04o: %w; run chmod 600 %s (or 640 with group vgpud)", path, fi.Mode().Perm(), errTokenFileMode, path)
	case fi.Size() > maxTokenFile:
		return "", fmt.Errorf("%s is %d bytes, more than %d: %w", path, fi.Size(), maxTokenFile, errTokenFileSize)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
	if err != nil {
		return "", fmt.Errorf("fleet token file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" || len(b) > maxTokenFile {
		return "", fmt.Errorf("%s holds %d bytes and no token: %w", path, len(b), errTokenFileSize)
	}
	return token, nil
}
