package sim

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Telling versions of state.json apart. Every read of the simulated host
// first checks that the state this process holds is still the committed
// one, without the file lock (the NVML pollers read many times a second),
// and every write checks it under the lock before it changes the state.
//
// Inode, size and modification time do not tell versions apart: ext4 gives
// the temp files of consecutive writes the same two inode numbers in turn,
// and a kernel without fine-grained file times gives every write within
// one clock tick the same mtime, so two quick writes that leave the file
// the size it had leave those three as they were. A process that read the
// state two writes ago would keep reading that old state, and write it back
// over the newer one with its next change.
//
// So each write tags its file with a random token, in an extended
// attribute set before the rename, and a reader compares tokens (one
// system call, as cheap as the stat it replaces). Where the filesystem
// keeps no user attributes, the state's generation, which every committed
// write raises by one, is read from the head of the file instead.

// versionAttr is the extended attribute holding a state.json's token.
const versionAttr = "user.vgpud-sim.version"

// fileStamp identifies one committed version of state.json: by its token,
// or, for a file without one, by its generation (with inode, size and
// mtime, which also tell a state.json deleted and created again apart).
type fileStamp struct {
	token      string
	ino        uint64
	size       int64
	mtime      int64
	generation uint64
}

// same reports whether two stamps are of one version.
func (s fileStamp) same(o fileStamp) bool {
	if s.token != "" || o.token != "" {
		return s.token == o.token
	}
	return s == o
}

func stampOf(fi os.FileInfo, generation uint64, token string) fileStamp {
	s := fileStamp{token: token, size: fi.Size(), mtime: fi.ModTime().UnixNano(), generation: generation}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = st.Ino
	}
	return s
}

// newToken is a write's token.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// tag sets a temp file's token; "" when the filesystem keeps none.
func tag(path string) string {
	t := newToken()
	if err := unix.Setxattr(path, versionAttr, []byte(t), 0); err != nil {
		return ""
	}
	return t
}

// tokenOf is the token of an open state.json, "" when it has none.
func tokenOf(f *os.File) string {
	var b [64]byte
	n, err := unix.Fgetxattr(int(f.Fd()), versionAttr, b[:])
	if err != nil {
		return ""
	}
	return string(b[:n])
}

// committed is the stamp of the state.json committed now: its token, or,
// for a file without one, its head and inode. It needs no file lock: a
// writer never writes a committed state.json again but replaces it by
// rename, so one path lookup or one open file is one version throughout.
// It uses the system calls directly: an os.File would also register the
// descriptor with the runtime's poller, on every read of the host.
func (h *Host) committed() (fileStamp, error) {
	var b [64]byte
	if n, err := unix.Getxattr(h.statePath(), versionAttr, b[:]); err == nil {
		return fileStamp{token: string(b[:n])}, nil
	}
	fd, err := unix.Open(h.statePath(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fileStamp{}, &fs.PathError{Op: "open", Path: h.statePath(), Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileStamp{}, &fs.PathError{Op: "stat", Path: h.statePath(), Err: err}
	}
	var head [stampHead]byte
	n, err := unix.Pread(fd, head[:], 0)
	if err != nil {
		return fileStamp{}, &fs.PathError{Op: "read", Path: h.statePath(), Err: err}
	}
	gen, ok := headGeneration(head[:n])
	if !ok {
		return fileStamp{}, fmt.Errorf("%w: %s does not start with its version and generation", ErrBadState, h.statePath())
	}
	return fileStamp{ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano(), generation: gen}, nil
}

// current reports whether the state this host holds is the committed one.
func (h *Host) current() bool {
	s, err := h.committed()
	return err == nil && s.same(h.stamp)
}

// stampHead is how much of state.json committed reads: encoding/json
// writes the state's first two fields first, {"version":1,"generation":N,
// which fit with room to spare.
const stampHead = 64

// headGeneration reads the generation from the head of state.json as
// encoding/json writes it: {"version":N,"generation":N, with no spaces.
func headGeneration(head []byte) (uint64, bool) {
	const prefix, key = `{"version":`, `,"generation":`
	rest, ok := bytes.CutPrefix(head, []byte(prefix))
	if !ok {
		return 0, false
	}
	// The key must follow the version (a number): another "generation" in
	// the file is not the state's.
	i := bytes.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if i <= 0 {
		return 0, false
	}
	if rest, ok = bytes.CutPrefix(rest[i:], []byte(key)); !ok {
		return 0, false
	}
	// The number must end inside the head: a cut one would read short.
	j := bytes.IndexAny(rest, ",}")
	if j <= 0 {
		return 0, false
	}
	g, err := strconv.ParseUint(string(rest[:j]), 10, 64)
	return g, err == nil
}
