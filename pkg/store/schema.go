package store

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	bbolt "go.etcd.io/bbolt"
)

// SchemaVersion is the schema version this build writes.
const SchemaVersion = 2

// Bucket names. Keys: tenants by name, instances by UUID, attachments by
// instance UUID, intents by ID; byTenant holds tenant+"\x00"+instance UUID
// with empty values, so a tenant's instances are a prefix scan.
const (
	bucketMeta        = "meta"
	bucketTenants     = "tenants"
	bucketInstances   = "instances"
	bucketByTenant    = "instances-by-tenant"
	bucketAttachments = "attachments"
	bucketIntents     = "intents"
	// bucketGPUs (schema 2) holds GPU state by GPU UUID.
	bucketGPUs = "gpus"

	keySchema = "schema"
)

// v1Buckets are the record buckets of schema 1.
func v1Buckets() []string {
	return []string{bucketTenants, bucketInstances, bucketByTenant, bucketAttachments, bucketIntents}
}

// recordBuckets are the buckets the record code reads and writes; the
// current schema must have them.
func recordBuckets() []string {
	return append(v1Buckets(), bucketGPUs)
}

// checkLimit bounds the files tx.Check walks at Open. A state database is
// a few MiB (hundreds of instances); above this, the full consistency check
// would slow start-up more than it is worth, and the page-by-page read in
// inspect still catches what would crash a reader.
const checkLimit = 64 << 20

// A migration rewrites a database at version v into version v+1, inside
// the one transaction Open runs every pending migration in. It works on
// raw buckets: the record types follow the latest schema only.
type migration func(tx *bbolt.Tx) error

// schema is the list of migrations; migrations[i] takes version i+1 to i+2.
type schema struct {
	migrations []migration
	// buckets are the record buckets the schema's last version has; nil:
	// schema 1's.
	buckets []string
}

func (s schema) recordBuckets() []string {
	if s.buckets == nil {
		return v1Buckets()
	}
	return s.buckets
}

func (s schema) current() int { return 1 + len(s.migrations) }

// productionSchema is the schema this build ships. Append a migration
// (and bump SchemaVersion) to change the layout; never edit a released one.
func productionSchema() schema {
	return schema{migrations: []migration{addGPUs}, buckets: recordBuckets()}
}

// addGPUs (schema 1 to 2) adds the GPU state bucket.
func addGPUs(tx *bbolt.Tx) error {
	_, err := tx.CreateBucket([]byte(bucketGPUs))
	return err
}

// createV1 lays out a new database at version 1.
func createV1(tx *bbolt.Tx) error {
	for _, name := range append([]string{bucketMeta}, v1Buckets()...) {
		if _, err := tx.CreateBucketIfNotExists([]byte(name)); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return putVersion(tx, 1)
}

func putVersion(tx *bbolt.Tx, v int) error {
	return tx.Bucket([]byte(bucketMeta)).Put([]byte(keySchema), []byte(strconv.Itoa(v)))
}

// readVersion returns the schema version in the meta bucket, 0 when there
// is no meta bucket.
func readVersion(tx *bbolt.Tx) (int, error) {
	meta := tx.Bucket([]byte(bucketMeta))
	if meta == nil {
		return 0, nil
	}
	raw := meta.Get([]byte(keySchema))
	v, err := strconv.Atoi(string(raw))
	if err != nil || v < 1 {
		return 0, fmt.Errorf("%w: meta/schema is %q, not a version number", ErrSchema, raw)
	}
	return v, nil
}

// errAbsent is inspect's answer for a path with no file: the one case in
// which Open creates a database.
var errAbsent = errors.New("no state database")

// inspect opens path read-only (a shared lock, no writes) and returns its
// schema version, 0 for a bbolt file without any bucket (a crash between
// create's link and the first schema transaction leaves one: it holds no
// record, so initialising it loses nothing), errAbsent when there is no
// file. An empty file is refused: bbolt would initialise it as new, and
// vgpud never leaves one (create), so it is a database that lost its
// content: truncated by a full disk, a bad restore or a stray redirect.
//
// bbolt trusts the file: a damaged page can make it panic, and a page
// beyond the end of a truncated file faults in the mmap. So the meta
// page's page count is checked against the file size before anything else
// is read, every page is read here with faults turned into panics, and a
// panic is recovered into ErrCorrupt. After a panic only the file is
// closed (bbolt's own Close could wait on a lock the panic left held); the
// read-only mapping is left to the process's exit, which a refusal leads to.
func inspect(path string, timeout time.Duration) (version int, err error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, errAbsent
	}
	if err != nil {
		return 0, fmt.Errorf("store: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("%s: %w: not a regular file", path, ErrCorrupt)
	}
	if fi.Size() == 0 {
		return 0, fmt.Errorf("%s: %w: the file is empty (0 bytes), and vgpud never leaves an empty one: its records were lost; restore a backup (%s.v<N>.bak) over it, or remove it to start with no tenants and no records (the devices on the host then show as foreign)",
			path, ErrCorrupt, path)
	}

	var file *os.File
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if file != nil {
				// Cleanup before the panic is turned into an error.
				_ = file.Close()
			}
			version, err = 0, fmt.Errorf("%s: %w: reading it failed: %v", path, ErrCorrupt, r)
		}
	}()
	bdb, err := bbolt.Open(path, 0, &bbolt.Options{
		ReadOnly: true,
		Timeout:  timeout,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag|syscall.O_NOFOLLOW, perm)
			file = f
			return f, err
		},
	})
	if err != nil {
		return 0, openError(path, timeout, err)
	}
	err = bdb.View(func(tx *bbolt.Tx) error {
		var verr error
		version, verr = inspectTx(tx, fi.Size())
		return verr
	})
	if cerr := bdb.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("store: close %s after inspecting it: %w", path, cerr)
	}
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return version, nil
}

func inspectTx(tx *bbolt.Tx, fileSize int64) (int, error) {
	if tx.Size() > fileSize {
		return 0, fmt.Errorf("%w: truncated: %d bytes, its pages need %d", ErrCorrupt, fileSize, tx.Size())
	}
	var names []string
	err := tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
		if b == nil {
			return fmt.Errorf("%w: top-level key %q is not a bucket", ErrCorrupt, name)
		}
		names = append(names, string(name))
		return readAll(b)
	})
	if err != nil {
		return 0, err
	}
	if fileSize <= checkLimit {
		for cerr := range tx.Check() {
			err = errors.Join(err, cerr)
		}
		if err != nil {
			return 0, fmt.Errorf("%w: consistency check: %w", ErrCorrupt, err)
		}
	}
	if len(names) == 0 {
		return 0, nil
	}
	if tx.Bucket([]byte(bucketMeta)) == nil {
		return 0, fmt.Errorf("%w: buckets %q but no %q bucket: not a vgpud state database", ErrCorrupt, names, bucketMeta)
	}
	return readVersion(tx)
}

// readAll touches the first and last byte of every key and value in b and
// its nested buckets, so that a page pointing outside the file faults here,
// where the fault is recovered, rather than in tx.Check's goroutine.
func readAll(b *bbolt.Bucket) error {
	var sink byte
	touch := func(p []byte) {
		if len(p) > 0 {
			sink ^= p[0] ^ p[len(p)-1]
		}
	}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		touch(k)
		touch(v)
		if v == nil {
			if nb := b.Bucket(k); nb != nil {
				if err := readAll(nb); err != nil {
					return err
				}
			}
		}
	}
	_ = sink
	return nil
}

// prepare brings the freshly opened (exclusively locked) file from the
// inspected version found to the schema's current version.
func (db *DB) prepare(found int, sch schema, log *slog.Logger) error {
	// inspect ran before the exclusive lock was taken; make sure nothing
	// changed the file in between.
	var now int
	if err := db.bolt.View(func(tx *bbolt.Tx) (err error) {
		now, err = readVersion(tx)
		return err
	}); err != nil {
		return fmt.Errorf("%s: %w", db.path, err)
	}
	if now != found {
		return fmt.Errorf("%w: %s changed while being opened (schema %d, then %d): is another vgpud running?",
			ErrLocked, db.path, found, now)
	}

	want := sch.current()
	if found < want {
		var backup string
		if found > 0 {
			var err error
			if backup, err = db.backup(found); err != nil {
				return err
			}
		}
		err := db.bolt.Update(func(tx *bbolt.Tx) error {
			from := found
			if from == 0 {
				if err := createV1(tx); err != nil {
					return fmt.Errorf("%w: create schema 1: %w", ErrSchema, err)
				}
				from = 1
			}
			for v := from; v < want; v++ {
				if err := sch.migrations[v-1](tx); err != nil {
					return fmt.Errorf("%w: migrate from schema %d to %d: %w", ErrSchema, v, v+1, err)
				}
			}
			return putVersion(tx, want)
		})
		if err != nil {
			if backup != "" {
				return fmt.Errorf("%s (left at schema %d; backup %s): %w", db.path, found, backup, err)
			}
			return fmt.Errorf("%s: %w", db.path, err)
		}
		if found == 0 {
			if err := syncDir(filepath.Dir(db.path)); err != nil {
				return fmt.Errorf("store: sync directory of %s: %w", db.path, err)
			}
			log.Info("created state database", "path", db.path, "schema", want)
		} else {
			log.Info("migrated state database", "path", db.path, "from", found, "to", want, "backup", backup)
		}
	}

	return db.bolt.View(func(tx *bbolt.Tx) error {
		for _, name := range sch.recordBuckets() {
			if tx.Bucket([]byte(name)) == nil {
				return fmt.Errorf("%s: %w: schema %d lacks bucket %q", db.path, ErrSchema, want, name)
			}
		}
		return nil
	})
}
