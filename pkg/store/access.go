package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// checkAccess refuses (ErrUnsafe) a state directory or database file that
// a user other than the one vgpud runs as could write: whoever can write
// either can rewrite the records vgpud acts on as root, or swap the file
// for one of their own. The directory is checked first and the file's name
// is then looked up without following links: once the directory is ours
// and closed to others, no one else can replace the name between this
// check and the open that follows.
//
// The directory may be readable by its group (the unit's
// StateDirectoryMode=0750); only write access is refused. A missing
// directory is the file system's error (fs.ErrNotExist), as before; a
// missing file is fine, Open creates it.
//
// state.db itself must be a regular file, not a symbolic link: the link's
// target lives in a directory this check does not cover. Moving the state
// elsewhere is done by pointing stateDir at the directory that holds it.
func checkAccess(path string) error {
	euid := os.Geteuid()
	dir := filepath.Dir(path)
	di, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("store: state directory of %s: %w", path, err)
	}
	if !di.IsDir() {
		return fmt.Errorf("store: state directory %s: %w", dir, syscall.ENOTDIR)
	}
	problems := ownProblems("state directory", dir, di, euid, "0750")

	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("store: %w", err)
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(path)
		if err != nil {
			return fmt.Errorf("store: %w", err)
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(dir, target)
		}
		problems = append(problems, fmt.Sprintf(
			"%s is a symbolic link (to %s); vgpud opens only a regular file in its state directory: move the file there (mv %s %s) or set stateDir to the directory that holds it",
			path, target, shellQuote(target), shellQuote(path)))
	case fi.Mode().IsRegular():
		problems = append(problems, ownProblems("state database", path, fi, euid, "0600")...)
	}
	// Anything else (a directory, a device) is refused for its content by
	// inspect.

	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrUnsafe, strings.Join(problems, "; "))
	}
	return nil
}

// ownProblems says what is wrong with fi's owner and mode, each with the
// command that fixes it; mode is the one vgpud creates (the file) or ships
// (the directory), so the fix leaves a known state.
func ownProblems(what, path string, fi fs.FileInfo, euid int, mode string) []string {
	var problems []string
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != euid {
		problems = append(problems, fmt.Sprintf("%s %s is owned by uid %d, not by uid %d that vgpud runs as: run chown %d %s",
			what, path, st.Uid, euid, euid, shellQuote(path)))
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		who := "group and others"
		switch {
		case perm&0o002 == 0:
			who = "its group"
		case perm&0o020 == 0:
			who = "others"
		}
		problems = append(problems, fmt.Sprintf("%s %s is writable by %s (mode %04o): run chmod %s %s",
			what, path, who, perm, mode, shellQuote(path)))
	}
	return problems
}

// shellQuote quotes s for a POSIX shell when it holds anything but the
// characters paths are usually made of, so a fix in a message can be pasted
// as it is.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:@%+=,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
