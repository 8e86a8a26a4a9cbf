// Package store owns vgpud's persistent state: tenants, instances, their
// attachments to libvirt domains, and the intent log of in-flight
// operations, in one bbolt file with a versioned schema.
//
// Records are JSON, one bucket per kind. DB.Update runs one bbolt
// transaction, so a caller changes several records atomically (commit an
// intent's step and the instance it produced, or admit an instance against
// a tenant's usage and store it). Every commit is fsynced.
//
// Open refuses, without changing a byte of it, a file that is locked by
// another process, corrupt or empty, written by a newer vgpud, or that a
// user other than vgpud's could write; it keeps a copy of one refused for
// its content, and migrates an older one after copying it aside. Only the
// manager and the daemon's wiring import this package; it imports
// pkg/tenant and nothing else from vgpud.
//
// Imports: pkg/tenant.
package store

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	bbolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Errors callers tell apart. Each is wrapped with what it concerns.
var (
	// ErrNotFound: no record of that kind with that key.
	ErrNotFound = errors.New("not found")
	// ErrLocked: another process holds the database file.
	ErrLocked = errors.New("state database locked")
	// ErrCorrupt: the file is not a readable vgpud state database (an
	// empty file included), or a record in it does not decode.
	ErrCorrupt = errors.New("state database corrupt")
	// ErrUnsafe: the state directory or the database file can be written
	// by a user other than the one vgpud runs as, or the file is a
	// symbolic link. The message gives the commands that fix it.
	ErrUnsafe = errors.New("state database unsafe")
	// ErrNewerSchema: the file was written by a newer vgpud.
	ErrNewerSchema = errors.New("state database schema is newer than this vgpud")
	// ErrSchema: the schema version is unreadable, a migration failed, or
	// the file lacks a bucket its schema version requires.
	ErrSchema = errors.New("state database schema error")
	// ErrInvalid: a record to put fails validation.
	ErrInvalid = errors.New("invalid record")
	// ErrConflict: a put carried a Generation other than the stored one.
	ErrConflict = errors.New("generation conflict")
	// ErrInUse: a delete would leave a dangling reference (a tenant that
	// still holds instances, an instance still attached).
	ErrInUse = errors.New("in use")
)

// DefaultTimeout is how long Open waits for another process's lock when
// Options.Timeout is zero.
const DefaultTimeout = time.Second

// Options configure Open.
type Options struct {
	// Timeout bounds the wait for the file lock; zero means DefaultTimeout.
	Timeout time.Duration
	// Logger receives creation and migration events; nil discards them.
	Logger *slog.Logger
	// Now stamps Intent.Updated in AppendStep; nil means time.Now.
	Now func() time.Time

	// schema replaces the production schema (its migrations), so tests can
	// exercise the migration mechanism.
	schema *schema
}

// DB is an open state database. Its methods are safe for concurrent use;
// bbolt runs one writer at a time and readers alongside.
type DB struct {
	bolt    *bbolt.DB
	path    string
	version int
	now     func() time.Time
}

// Open opens the state database at path, creating it (schema
// SchemaVersion) only when there is no file; an empty file is refused as
// ErrCorrupt, never initialised, since it can only be a database that lost
// its content (vgpud never leaves one: see create). The directory must
// exist, and it and the file must be the daemon's user's and closed to
// others' writes (ErrUnsafe). An older schema is migrated in one
// transaction after the file is copied to path+".v<N>.bak". Errors wrap
// ErrLocked, ErrCorrupt, ErrNewerSchema, ErrSchema or ErrUnsafe as their
// doc comments say; a refused file is left byte for byte as it was, and
// one refused for its content is also copied to path+".refused-<hash>"
// (see keepRefused).
func Open(path string, opts Options) (*DB, error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	sch := productionSchema()
	if opts.schema != nil {
		sch = *opts.schema
	}

	if err := checkAccess(path); err != nil {
		return nil, err
	}
	// Read-only first: nothing is written to a file until it is known to
	// be ours, readable and not newer.
	found, err := inspect(path, timeout)
	if errors.Is(err, errAbsent) {
		if err = create(path, timeout); err == nil {
			// Whatever is at path now (ours, or another creator's that
			// won the race) is inspected like any file.
			found, err = inspect(path, timeout)
		}
	}
	if err == nil && found > sch.current() {
		err = fmt.Errorf("%w: %s has schema version %d, this vgpud reads up to %d: run a newer vgpud, or restore a backup",
			ErrNewerSchema, path, found, sch.current())
	}
	if err != nil {
		if refusedForContent(err) {
			err = keepRefused(path, err)
		}
		return nil, err
	}

	// Never O_CREATE: a file bbolt created here would be empty until its
	// first write, and an empty file is refused (create makes new files).
	// No link is followed, whatever replaced the file since checkAccess.
	bdb, err := bbolt.Open(path, 0o600, &bbolt.Options{
		Timeout: timeout,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			return os.OpenFile(name, flag&^os.O_CREATE|syscall.O_NOFOLLOW, perm)
		},
	})
	if err != nil {
		return nil, openError(path, timeout, err)
	}
	db := &DB{bolt: bdb, path: path, version: sch.current(), now: now}
	if err := db.prepare(found, sch, log); err != nil {
		// prepare's error is the one to report; the file was only read.
		_ = bdb.Close()
		if found == sch.current() && refusedForContent(err) {
			// Nothing was migrated, so the file is as it was found (a
			// failed migration has its backup already).
			err = keepRefused(path, err)
		}
		return nil, err
	}
	return db, nil
}

// create makes a new database file at path that already holds bbolt's
// initial pages, so that no crash leaves an empty file there: bbolt
// creates the file and only then writes its pages, so it is built under a
// temporary name and linked into place. A link, unlike a rename, fails
// when path appeared meanwhile (another vgpud created it), which is not an
// error here: the caller inspects whatever is at path.
//
// A crash after the link and before Open's first transaction leaves a
// bbolt file without buckets, which Open initialises (it holds no
// record); one before the temporary name is removed leaves that name
// behind, a link to state.db or a file no one reads.
func create(path string, timeout time.Duration) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".new-*")
	if err != nil {
		return fmt.Errorf("store: create %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	err = f.Close()
	if err == nil {
		var bdb *bbolt.DB
		if bdb, err = bbolt.Open(tmp, 0o600, &bbolt.Options{Timeout: timeout}); err == nil {
			err = bdb.Close()
		}
	}
	if err == nil {
		if err = os.Link(tmp, path); errors.Is(err, fs.ErrExist) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("store: create %s: %w", path, err)
	}
	return nil
}

// openError turns bbolt.Open's error into the package's.
func openError(path string, timeout time.Duration, err error) error {
	var pathErr *fs.PathError
	var errno syscall.Errno
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("%w: %s is held by another process (waited %s): is another vgpud running?", ErrLocked, path, timeout)
	case errors.As(err, &pathErr), errors.As(err, &errno):
		// The file system's own error (permission, missing directory, mmap
		// failure): not a verdict on the file's content.
		return fmt.Errorf("store: open %s: %w", path, err)
	default:
		// bbolt's meta-page checks: invalid, checksum, version, too small.
		return fmt.Errorf("%s: %w: %w", path, ErrCorrupt, err)
	}
}

// Path is the database file's path.
func (db *DB) Path() string { return db.path }

// SchemaVersion is the schema version of the open file.
func (db *DB) SchemaVersion() int { return db.version }

// Close waits for open transactions and closes the file, releasing the lock.
func (db *DB) Close() error {
	if err := db.bolt.Close(); err != nil {
		return fmt.Errorf("store: close %s: %w", db.path, err)
	}
	return nil
}

// View runs fn in a read-only transaction. fn's error is returned as is.
func (db *DB) View(fn func(*Tx) error) error {
	return db.bolt.View(func(btx *bbolt.Tx) error {
		return fn(&Tx{tx: btx, now: db.now})
	})
}

// Update runs fn in a read-write transaction, committed (and fsynced) when
// fn returns nil. When fn returns an error or panics, every write it made
// is rolled back and the error (or panic) passes through unchanged.
func (db *DB) Update(fn func(*Tx) error) error {
	var fnErr error
	err := db.bolt.Update(func(btx *bbolt.Tx) error {
		fnErr = fn(&Tx{tx: btx, now: db.now})
		return fnErr
	})
	if err != nil && fnErr == nil {
		return fmt.Errorf("store: commit to %s: %w", db.path, err)
	}
	return err
}

// syncDir fsyncs a directory so that a file created or renamed in it
// survives a crash.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// backupPath is where Open copies a file at schema version v before
// migrating it.
func backupPath(path string, v int) string {
	return fmt.Sprintf("%s.v%d.bak", path, v)
}

// backup copies the open database, as of one read transaction, to
// backupPath atomically: a crash leaves the previous backup or the new one,
// never half of one.
func (db *DB) backup(v int) (string, error) {
	dst := backupPath(db.path, v)
	tmp := dst + ".tmp"
	err := db.bolt.View(func(tx *bbolt.Tx) error {
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		_, err = tx.WriteTo(f)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err == nil {
		err = syncDir(filepath.Dir(dst))
	}
	if err != nil {
		// Cleanup of a half-written backup; the backup's error is reported.
		_ = os.Remove(tmp)
		return "", fmt.Errorf("store: back up %s to %s before migrating: %w", db.path, dst, err)
	}
	return dst, nil
}
