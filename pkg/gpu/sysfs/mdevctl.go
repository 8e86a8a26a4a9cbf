package sysfs

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// mdevctl keeps persistent mdev definitions in its config directory,
// /etc/mdevctl.d: a directory per parent device, a JSON file per mdev
// named by its UUID ({"mdev_type": "nvidia-558", "start": "auto",
// "attrs": [...]}); with "start": "auto" a udev rule creates the mdev
// whenever its parent appears. vgpud reads the directory, never writes it,
// to say which foreign mdevs mdevctl owns (and would bring back at boot).
//
// Whatever is in the directory is input vgpud does not control, read at
// every discovery: a FIFO there would block an open or a read until
// something writes to it, a link to /dev/zero never ends, and opening a
// device node can act on the device (a watchdog starts counting). So
// only regular files are opened, and only after lstat said so: nothing
// that is not one is opened at all, a symbolic link is not followed (its
// target is not vetted without opening it), and the open itself is
// O_NOFOLLOW|O_NONBLOCK and checked again with fstat (the entry may have
// been replaced meanwhile). A definition is read up to
// MaxMdevctlDefinition bytes, the directory up to MaxMdevctlEntries
// entries a level, and the whole read within MdevctlReadTimeout. Every
// entry skipped for one of these reasons is reported (MdevctlFileError),
// and the others are still read.

// DefaultMdevctlDir is mdevctl's config directory.
const DefaultMdevctlDir = "/etc/mdevctl.d"

// MaxMdevctlDefinition bounds one definition file. mdevctl writes a small
// JSON object: the type, the start policy and the device's attributes;
// the largest real ones (a vfio_ap matrix assigning every adapter and
// domain, 256 of each) are under 16 KiB, an NVIDIA vGPU's a few hundred
// bytes. 64 KiB is four times the largest, and bounds what one file costs
// the daemon: a larger one is reported and skipped, not read.
const MaxMdevctlDefinition = 64 << 10

// MaxMdevctlEntries bounds the entries read of the directory and of each
// parent's directory: a host has at most a few hundred mdevs (one per VF,
// or a GPU's few dozen), so a directory with more holds something else.
const MaxMdevctlEntries = 4096

// MdevctlReadTimeout bounds one read of the directory: local files are
// read in milliseconds, so a read that takes longer is a file system that
// does not answer (a hung network mount), reported instead of holding
// discovery, and so every create and reconcile, behind it.
const MdevctlReadTimeout = 5 * time.Second

// mdevctlTimeout and mdevctlReadDir are MdevctlReadTimeout and the read
// itself; tests replace them to stand for a file system that hangs.
var (
	mdevctlTimeout = MdevctlReadTimeout
	mdevctlReadDir = readMdevctlDir
)

// ErrMdevctlTimeout: the directory was not read within its deadline.
var ErrMdevctlTimeout = errors.New("mdevctl's config directory did not answer in time")

// MdevctlFileError is an entry of mdevctl's directory that was skipped:
// not a regular file, too large, unreadable or not a definition. UUID
// and Parent are what its name says it defines.
type MdevctlFileError struct {
	File, Parent, UUID string
	Err                error
}

func (e *MdevctlFileError) Error() string {
	return fmt.Sprintf("mdevctl definition %s skipped: %v", e.File, e.Err)
}

func (e *MdevctlFileError) Unwrap() error { return e.Err }

// MdevctlFileErrors lists the skipped entries err (ReadMdevctl's) names.
func MdevctlFileErrors(err error) []*MdevctlFileError {
	var out []*MdevctlFileError
	var walk func(error)
	walk = func(err error) {
		var fe *MdevctlFileError
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
		} else if errors.As(err, &fe) {
			out = append(out, fe)
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// mdevctlFile is the JSON of one definition; attrs are device-specific
// and not needed here.
type mdevctlFile struct {
	MdevType string `json:"mdev_type"`
	Start    string `json:"start"`
}

// ReadMdevctl reads every definition in mdevctl's config directory dir,
// within ctx and MdevctlReadTimeout. A directory that does not exist
// (mdevctl not installed) holds none. Entries that are not definitions
// by their name (mdevctl's scripts.d, files not named by a UUID) are
// passed over; an entry named as a definition that is not a readable
// regular file of at most MaxMdevctlDefinition bytes holding one is
// reported in the error (a MdevctlFileError each, joined), while the
// others are still returned. A read that outlives its deadline returns
// ErrMdevctlTimeout and nothing: the reading goroutine is left to finish
// on its own (callers that read again meanwhile should not start another:
// Sysfs does not).
func ReadMdevctl(ctx context.Context, dir string) ([]gpu.MdevctlDefinition, error) {
	return readMdevctl(ctx, dir, nil, nil)
}

// readMdevctl is ReadMdevctl; a read that outlives its deadline calls
// abandon at once and back when it returns at last (each under the same
// lock, so back never comes before abandon).
func readMdevctl(ctx context.Context, dir string, abandon, back func()) ([]gpu.MdevctlDefinition, error) {
	ctx, cancel := context.WithTimeout(ctx, mdevctlTimeout)
	defer cancel()
	var (
		mu                  sync.Mutex
		finished, abandoned bool
		defs                []gpu.MdevctlDefinition
		rerr                error
	)
	done := make(chan struct{})
	go func() {
		d, err := mdevctlReadDir(ctx, dir)
		mu.Lock()
		defs, rerr, finished = d, err, true
		if abandoned && back != nil {
			back()
		}
		mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			abandoned = true
			if abandon != nil {
				abandon()
			}
			return nil, fmt.Errorf("mdevctl definitions in %s: %w within %v (%w)", dir, ErrMdevctlTimeout, mdevctlTimeout, ctx.Err())
		}
	}
	return defs, rerr
}

// readDirBounded lists up to MaxMdevctlEntries entries of dir, sorted; more
// is an error (the first ones are still returned). follow: dir may be a
// symbolic link (the configured directory is the operator's choice; the
// parents in it are lstat'ed entries, never followed).
func readDirBounded(dir string, follow bool) ([]fs.DirEntry, error) {
	flags := os.O_RDONLY | syscall.O_DIRECTORY | syscall.O_NONBLOCK | syscall.O_CLOEXEC
	if !follow {
		flags |= syscall.O_NOFOLLOW
	}
	f, err := os.OpenFile(dir, flags, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries, err := f.ReadDir(MaxMdevctlEntries + 1)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	if len(entries) > MaxMdevctlEntries {
		return entries[:MaxMdevctlEntries], fmt.Errorf("more than %d entries; the rest are not read", MaxMdevctlEntries)
	}
	return entries, nil
}

func readMdevctlDir(ctx context.Context, dir string) ([]gpu.MdevctlDefinition, error) {
	parents, err := readDirBounded(dir, true)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var errs []error
	if err != nil {
		if parents == nil {
			return nil, fmt.Errorf("mdevctl definitions in %s: %w", dir, err)
		}
		errs = append(errs, fmt.Errorf("mdevctl definitions in %s: %w", dir, err))
	}
	var out []gpu.MdevctlDefinition
	for _, p := range parents {
		// Parents are directories; anything else at the top (mdevctl's
		// own files, a link) is not mdevctl's layout and is passed over
		// without opening it.
		if !p.IsDir() {
			continue
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		files, err := readDirBounded(filepath.Join(dir, p.Name()), false)
		if err != nil {
			errs = append(errs, fmt.Errorf("mdevctl definitions of %s: %w", p.Name(), err))
			if files == nil {
				continue
			}
		}
		for _, f := range files {
			if !uuidRE.MatchString(f.Name()) {
				continue
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			name := path.Join(p.Name(), f.Name())
			d, err := readMdevctlFile(filepath.Join(dir, p.Name(), f.Name()), name)
			if err != nil {
				errs = append(errs, &MdevctlFileError{File: name, Parent: p.Name(), UUID: strings.ToLower(f.Name()), Err: err})
				continue
			}
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].File < out[j].File })
	return out, errors.Join(errs...)
}

// fileKind names what a non-regular entry is, for the report.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symbolic link (not followed)"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	}
	return "not a regular file"
}

// readRegular reads file, a regular file of at most max bytes, as the
// package comment says: lstat, open without following or blocking, fstat.
func readRegular(file string, max int64) ([]byte, error) {
	li, err := os.Lstat(file)
	if err != nil {
		return nil, err
	}
	if !li.Mode().IsRegular() {
		return nil, fmt.Errorf("it is %s; only regular files are read", fileKind(li.Mode()))
	}
	if li.Size() > max {
		return nil, fmt.Errorf("it is %d bytes; a definition is at most %d", li.Size(), max)
	}
	f, err := os.OpenFile(file, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("it became %s", fileKind(fs.ModeSymlink))
		}
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || !os.SameFile(li, fi) {
		return nil, fmt.Errorf("it was replaced while being read (now %s)", fileKind(fi.Mode()))
	}
	// The size lstat gave may grow: the read stops one byte past max.
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("it is more than %d bytes; a definition is at most that", max)
	}
	return b, nil
}

func readMdevctlFile(file, name string) (gpu.MdevctlDefinition, error) {
	b, err := readRegular(file, MaxMdevctlDefinition)
	if err != nil {
		return gpu.MdevctlDefinition{}, err
	}
	var f mdevctlFile
	if err := json.Unmarshal(b, &f); err != nil {
		return gpu.MdevctlDefinition{}, err
	}
	if f.MdevType == "" {
		return gpu.MdevctlDefinition{}, errors.New("no mdev_type")
	}
	if f.Start != "auto" && f.Start != "manual" {
		return gpu.MdevctlDefinition{}, fmt.Errorf("start %q, want auto or manual", f.Start)
	}
	parent, uuid := path.Split(name)
	return gpu.MdevctlDefinition{UUID: strings.ToLower(uuid), Parent: strings.TrimSuffix(parent, "/"), Type: f.MdevType, Start: f.Start, File: name}, nil
}

// ParseMdevctlList reads the output of `mdevctl list --defined`: a line
// "UUID PARENT TYPE START" per definition, optionally followed by indented
// attribute lines (--verbose), which are skipped. Any other line is an
// error naming it.
func ParseMdevctlList(r io.Reader) ([]gpu.MdevctlDefinition, error) {
	var out []gpu.MdevctlDefinition
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t") {
			continue
		}
		f := strings.Fields(line)
		// An active device also defined shows "(defined)" in plain `list`;
		// `list --defined` prints the start policy, possibly followed by
		// "(active)" in newer versions.
		if len(f) == 5 && f[4] == "(active)" {
			f = f[:4]
		}
		if len(f) != 4 || !uuidRE.MatchString(f[0]) || (f[3] != "auto" && f[3] != "manual") {
			return nil, fmt.Errorf("mdevctl list line %d: %q is not \"UUID PARENT TYPE auto|manual\"", n, line)
		}
		out = append(out, gpu.MdevctlDefinition{UUID: strings.ToLower(f[0]), Parent: f[1], Type: f[2], Start: f[3]})
	}
	return out, sc.Err()
}

// MdevctlLine is d as `mdevctl list --defined` prints it.
func MdevctlLine(d gpu.MdevctlDefinition) string {
	return fmt.Sprintf("%s %s %s %s", d.UUID, d.Parent, d.Type, d.Start)
}
