package store

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// refusedForContent reports whether err refuses the file for what it
// holds (corrupt, empty, an unreadable or newer schema), as opposed to who
// holds it (ErrLocked), who may write it (ErrUnsafe) or the file system's
// own errors: only those files are copied aside.
func refusedForContent(err error) bool {
	return errors.Is(err, ErrCorrupt) || errors.Is(err, ErrSchema) || errors.Is(err, ErrNewerSchema)
}

// keepRefused copies the file Open refused for its content to
// refusedPath and adds where to the error; a failed copy is added to the
// error too, which stays the refusal. The file itself is left as it was;
// the copy is there because the operator's way out of a refusal is to
// move the file or restore a backup over it, and what was refused (the
// only trace of what happened, or a newer vgpud's records after a
// downgrade) must outlive that.
//
// The copy is named by its content, so the restarts of a daemon that keeps
// being refused (Restart=on-failure) add no copy of the same file. It is
// not made when it would take more than half of the file system's free
// space: a refused start must not fill /var.
func keepRefused(path string, refusal error) error {
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() {
		// Gone, or a directory or device: nothing a copy could keep.
		return refusal
	}
	dst, err := copyRefused(path, fi.Size())
	if err != nil {
		return fmt.Errorf("%w (no copy kept: %v)", refusal, err)
	}
	return fmt.Errorf("%w (a copy is kept as %s)", refusal, dst)
}

// refusedPath is where a refused file whose content hashes to sum is
// copied.
func refusedPath(path string, sum []byte) string {
	return fmt.Sprintf("%s.refused-%s", path, hex.EncodeToString(sum[:6]))
}

func copyRefused(path string, size int64) (string, error) {
	dir := filepath.Dir(path)
	src, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return "", err
	}
	defer src.Close()

	h := sha256.New()
	if _, err := io.Copy(h, src); err != nil {
		return "", err
	}
	dst := refusedPath(path, h.Sum(nil))
	if _, err := os.Lstat(dst); err == nil {
		return dst, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}

	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err == nil {
		if free := int64(st.Bavail) * int64(st.Bsize); size > free/2 {
			return "", fmt.Errorf("%s holds %d bytes, more than half of the %d free in %s", path, size, free, dir)
		}
	}

	// Copy to a temporary name and rename, so that a crash leaves no
	// partial copy under a content name; the content is hashed again as it
	// is copied, in case it changed since.
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".refused-*.tmp")
	if err != nil {
		return "", err
	}
	defer func() {
		if tmp != nil {
			// Cleanup after a failed copy: the copy's own error is reported.
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	h.Reset()
	if _, err := io.Copy(io.MultiWriter(tmp, h), src); err != nil {
		return "", err
	}
	if err := tmp.Sync(); err != nil {
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	dst = refusedPath(path, h.Sum(nil))
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", err
	}
	tmp = nil
	if err := syncDir(dir); err != nil {
		return "", err
	}
	return dst, nil
}
