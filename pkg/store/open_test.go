package store

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"
)

// rawSchema reads meta/schema with bbolt directly.
func rawSchema(t *testing.T, path string) string {
	t.Helper()
	var v string
	rawView(t, path, func(tx *bbolt.Tx) error {
		v = string(tx.Bucket([]byte(bucketMeta)).Get([]byte(keySchema)))
		return nil
	})
	return v
}

func rawView(t *testing.T, path string, fn func(*bbolt.Tx) error) {
	t.Helper()
	bdb, err := bbolt.Open(path, 0, &bbolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	if err := bdb.View(fn); err != nil {
		t.Fatal(err)
	}
}

// dump returns every key and value in the file, as "bucket/key" -> value.
func dump(t *testing.T, path string) map[string]string {
	t.Helper()
	out := map[string]string{}
	rawView(t, path, func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			return b.ForEach(func(k, v []byte) error {
				out[string(name)+"/"+string(k)] = string(v)
				return nil
			})
		})
	})
	return out
}

func rawUpdate(t *testing.T, path string, fn func(*bbolt.Tx) error) {
	t.Helper()
	bdb, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	if err := bdb.Update(fn); err != nil {
		t.Fatal(err)
	}
}

// populated writes a v1 database at path with enough records to span many
// pages, and returns its bytes.
func populated(t *testing.T, path string, instances int) []byte {
	t.Helper()
	return populatedAt(t, path, instances, nil)
}

// populatedAt is populated with a schema (nil: production; &schema{}: a
// schema 1 file, as vgpud releases with schema 1 wrote).
func populatedAt(t *testing.T, path string, instances int, sch *schema) []byte {
	t.Helper()
	db, err := Open(path, Options{schema: sch})
	if err != nil {
		t.Fatal(err)
	}
	mustUpdate(t, db, func(tx *Tx) error {
		acme := testTenant("acme")
		if err := tx.PutTenant(&acme); err != nil {
			return err
		}
		for i := range instances {
			in := testInstance(fmt.Sprintf("inst-%04d", i), "acme")
			in.Reason = strings.Repeat("x", 200)
			if err := tx.PutInstance(&in); err != nil {
				return err
			}
		}
		return nil
	})
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return readFile(t, path)
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// dirNames lists a directory, to check a refusal left no file behind.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestOpenLockedInProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	checkLocked(t, path)
}

// checkLocked opens path, which something else holds, and expects ErrLocked
// after the timeout.
func checkLocked(t *testing.T, path string) {
	t.Helper()
	const timeout = 200 * time.Millisecond
	start := time.Now()
	db, err := Open(path, Options{Timeout: timeout})
	elapsed := time.Since(start)
	if err == nil {
		db.Close()
		t.Fatal("second Open succeeded, want ErrLocked")
	}
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	if msg := err.Error(); !strings.Contains(msg, path) || !strings.Contains(msg, "is another vgpud running?") {
		t.Errorf("message %q should name %s and ask whether another vgpud runs", msg, path)
	}
	// bbolt polls the lock every 50ms and gives up once less than one poll
	// is left, so the wait is within 50ms short of the timeout.
	if elapsed < timeout-60*time.Millisecond || elapsed > timeout+5*time.Second {
		t.Errorf("ErrLocked after %s, want after about %s", elapsed, timeout)
	}
}

// TestHelperHoldLock is the child process of TestOpenLockedByOtherProcess:
// it opens the database named by VGPUD_STORE_HOLD, says "locked", and holds
// it until its stdin closes.
func TestHelperHoldLock(t *testing.T) {
	path := os.Getenv("VGPUD_STORE_HOLD")
	if path == "" {
		t.Skip("helper process of TestOpenLockedByOtherProcess")
	}
	db, err := Open(path, Options{})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	fmt.Println("locked")
	_, _ = io.Copy(io.Discard, os.Stdin)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestOpenLockedByOtherProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperHoldLock$", "-test.count=1")
	cmd.Env = append(os.Environ(), "VGPUD_STORE_HOLD="+path)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	for lines.Scan() && lines.Text() != "locked" {
		t.Logf("helper: %s", lines.Text())
	}
	if lines.Text() != "locked" {
		_ = cmd.Wait()
		t.Fatalf("helper exited without locking the database")
	}

	checkLocked(t, path)

	_ = stdin.Close()
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v", err)
	}
	db, err := Open(path, Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("Open after the helper exited: %v", err)
	}
	db.Close()
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	populated(t, path, 10)
	rawUpdate(t, path, func(tx *bbolt.Tx) error { return putVersion(tx, SchemaVersion+1) })
	before := readFile(t, path)

	_, err := Open(path, Options{})
	if !errors.Is(err, ErrNewerSchema) {
		t.Fatalf("Open = %v, want ErrNewerSchema", err)
	}
	checkRefused(t, path, before, err)
}

// checkRefused checks what a refusal of the file at path for its content
// leaves: the file as it was (before), and beside it one copy of it, named
// in the error.
func checkRefused(t *testing.T, path string, before []byte, err error) {
	t.Helper()
	if !bytes.Equal(readFile(t, path), before) {
		t.Error("refused file was modified")
	}
	sum := sha256.Sum256(before)
	cp := refusedPath(path, sum[:])
	if names, want := dirNames(t, filepath.Dir(path)), []string{"state.db", filepath.Base(cp)}; !slices.Equal(names, want) {
		t.Errorf("directory holds %v after refusal, want %v", names, want)
	}
	if got, err := os.ReadFile(cp); err != nil || !bytes.Equal(got, before) {
		t.Errorf("copy %s of the refused file: %v, equal: %t", cp, err, bytes.Equal(got, before))
	}
	if msg := err.Error(); !strings.Contains(msg, path) || !strings.Contains(msg, "a copy is kept as "+cp) {
		t.Errorf("message %q should name %s and its copy %s", msg, path, cp)
	}
}

func TestOpenRefusesCorrupt(t *testing.T) {
	tests := []struct {
		name string
		make func(t *testing.T, path string) // writes the bad file
		want error
	}{
		// vgpud never leaves an empty file (create), so one is a database
		// that lost its content, not a new one.
		{"empty file", func(t *testing.T, path string) { writeFile(t, path, nil) }, ErrCorrupt},
		{"random bytes", func(t *testing.T, path string) {
			b := make([]byte, 64<<10)
			r := rand.New(rand.NewPCG(1, 2))
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			writeFile(t, path, b)
		}, ErrCorrupt},
		{"text file", func(t *testing.T, path string) {
			writeFile(t, path, []byte("not a database\n"))
		}, ErrCorrupt},
		{"truncated to half", func(t *testing.T, path string) {
			b := populated(t, path, 300)
			writeFile(t, path, b[:len(b)/2])
		}, ErrCorrupt},
		{"truncated to two pages", func(t *testing.T, path string) {
			b := populated(t, path, 300)
			writeFile(t, path, b[:2*os.Getpagesize()])
		}, ErrCorrupt},
		{"truncated to 100 bytes", func(t *testing.T, path string) {
			b := populated(t, path, 10)
			writeFile(t, path, b[:100])
		}, ErrCorrupt},
		{"damaged pages", func(t *testing.T, path string) {
			b := populated(t, path, 300)
			r := rand.New(rand.NewPCG(3, 4))
			for i := 4 * os.Getpagesize(); i < len(b); i++ {
				b[i] = byte(r.Uint32())
			}
			writeFile(t, path, b)
		}, ErrCorrupt},
		{"damaged page headers", func(t *testing.T, path string) {
			b := populated(t, path, 300)
			ps := os.Getpagesize()
			for p := 2 * ps; p < len(b); p += ps {
				copy(b[p:p+16], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x13, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
			}
			writeFile(t, path, b)
		}, ErrCorrupt},
		// A branch element naming a page beyond the end of the file reads
		// mapped memory with no file behind it (SIGBUS); one far beyond
		// the mapping reads unmapped memory (SIGSEGV). Both must come back
		// as ErrCorrupt, not crash the process.
		{"branch points past the file", func(t *testing.T, path string) {
			// bbolt maps the file rounded up to a power of two; one page
			// more than a power of two leaves mapped pages past the end.
			b := append(populated(t, path, 300), make([]byte, os.Getpagesize())...)
			pointBranchAt(t, b, uint64(len(b)/os.Getpagesize()+8))
			writeFile(t, path, b)
		}, ErrCorrupt},
		{"branch points past the mapping", func(t *testing.T, path string) {
			b := populated(t, path, 300)
			pointBranchAt(t, b, 1<<24)
			writeFile(t, path, b)
		}, ErrCorrupt},
		{"foreign bbolt file", func(t *testing.T, path string) {
			rawUpdate(t, path, func(tx *bbolt.Tx) error {
				b, err := tx.CreateBucket([]byte("widgets"))
				if err != nil {
					return err
				}
				return b.Put([]byte("k"), []byte("v"))
			})
		}, ErrCorrupt},
		{"schema not a number", func(t *testing.T, path string) {
			populated(t, path, 1)
			rawUpdate(t, path, func(tx *bbolt.Tx) error {
				return tx.Bucket([]byte(bucketMeta)).Put([]byte(keySchema), []byte("one"))
			})
		}, ErrSchema},
		{"schema missing", func(t *testing.T, path string) {
			populated(t, path, 1)
			rawUpdate(t, path, func(tx *bbolt.Tx) error {
				return tx.Bucket([]byte(bucketMeta)).Delete([]byte(keySchema))
			})
		}, ErrSchema},
		{"record bucket missing", func(t *testing.T, path string) {
			populated(t, path, 1)
			rawUpdate(t, path, func(tx *bbolt.Tx) error { return tx.DeleteBucket([]byte(bucketIntents)) })
		}, ErrSchema},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			tc.make(t, path)
			before := readFile(t, path)
			db, err := Open(path, Options{})
			if err == nil {
				db.Close()
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Open = %v, want %v", err, tc.want)
			}
			t.Logf("refused: %v", err)
			checkRefused(t, path, before, err)
		})
	}
}

func TestOpenRefusesEmptyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	writeFile(t, path, nil)
	for range 2 {
		db, err := Open(path, Options{})
		if err == nil {
			db.Close()
			t.Fatal("Open initialised an empty file, want ErrCorrupt")
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Open = %v, want ErrCorrupt", err)
		}
		if msg := err.Error(); !strings.Contains(msg, "empty") || !strings.Contains(msg, "restore a backup") || !strings.Contains(msg, "remove it") {
			t.Errorf("message %q should say the file is empty and how to go on", msg)
		}
		// A daemon restarted after each refusal keeps one copy.
		checkRefused(t, path, nil, err)
	}
}

// A refused file is copied once per content: a file that changed between
// two refusals is copied again, and the copies are kept.
func TestOpenRefusedCopies(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	for i, content := range []string{"not a database\n", "not a database\n", "still not one\n"} {
		writeFile(t, path, []byte(content))
		if _, err := Open(path, Options{}); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Open %d = %v, want ErrCorrupt", i, err)
		}
	}
	names := dirNames(t, dir)
	if len(names) != 3 {
		t.Fatalf("directory holds %v, want state.db and two copies", names)
	}
	for _, content := range []string{"not a database\n", "still not one\n"} {
		sum := sha256.Sum256([]byte(content))
		if got := string(readFile(t, refusedPath(path, sum[:]))); got != content {
			t.Errorf("copy holds %q, want %q", got, content)
		}
	}
}

// A refusal for anything but the content makes no copy: a file another
// process holds is live, and one that others could write is not trusted.
func TestOpenRefusedLockedNotCopied(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := Open(path, Options{Timeout: 100 * time.Millisecond}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	if names := dirNames(t, filepath.Dir(path)); !slices.Equal(names, []string{"state.db"}) {
		t.Errorf("directory holds %v, want only state.db", names)
	}
}

// pointBranchAt rewrites the first element of every branch page in the
// database image b to point at page id. The layout is bbolt's: a 16-byte
// page header (id u64, flags u16, count u16, overflow u32; flags 0x01 is a
// branch page), then 16-byte elements (pos u32, ksize u32, pgid u64).
func pointBranchAt(t *testing.T, b []byte, id uint64) {
	t.Helper()
	ps := os.Getpagesize()
	n := 0
	for p := 2 * ps; p+ps <= len(b); p += ps {
		if binary.LittleEndian.Uint16(b[p+8:]) == 0x01 && binary.LittleEndian.Uint16(b[p+10:]) > 0 {
			binary.LittleEndian.PutUint64(b[p+16+8:], id)
			n++
		}
	}
	if n == 0 {
		t.Fatal("no branch page in the image: populate more records")
	}
}

func TestOpenRefusesDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open(directory) = %v, want ErrCorrupt", err)
	}
	if names := dirNames(t, filepath.Dir(path)); !slices.Equal(names, []string{"state.db"}) {
		t.Errorf("directory holds %v, want only state.db (a directory is not copied)", names)
	}
}

func TestOpenMissingDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent", "state.db")
	_, err := Open(path, Options{})
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open in a missing directory = %v, want the file system's not-exist error", err)
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A bbolt file with no bucket is initialised: create links a file with
// bbolt's initial pages into place and the first schema transaction adds
// the buckets, so a crash between the two leaves one. It holds no record,
// so nothing is lost by initialising it (an empty file, which could be a
// database that lost its records, is refused: TestOpenRefusesEmptyFile).
func TestOpenInitialisesBucketlessFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	rawUpdate(t, path, func(*bbolt.Tx) error { return nil })
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	mustView(t, db, func(tx *Tx) error { _, err := tx.Instances(); return err })
	db.Close()
	if got, want := rawSchema(t, path), strconv.Itoa(SchemaVersion); got != want {
		t.Errorf("meta/schema = %q, want %q", got, want)
	}
	if names := dirNames(t, filepath.Dir(path)); !slices.Equal(names, []string{"state.db"}) {
		t.Errorf("directory holds %v, want only state.db", names)
	}
}

// create never leaves an empty file at path: the file appears with bbolt's
// pages in it, and one that appeared meanwhile is left as it is.
func TestCreate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	if err := create(path, time.Second); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Size() == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("created file: %v, %v", fi, err)
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{"state.db"}) {
		t.Errorf("directory holds %v, want only state.db", names)
	}
	if got := dump(t, path); len(got) != 0 {
		t.Errorf("created file holds %v, want no bucket", got)
	}

	before := populated(t, path, 3)
	if err := create(path, time.Second); err != nil {
		t.Fatalf("create over an existing file: %v", err)
	}
	if !bytes.Equal(readFile(t, path), before) {
		t.Error("create changed an existing file")
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{"state.db"}) {
		t.Errorf("directory holds %v, want only state.db", names)
	}
}

// Test-only migrations: v1 -> v2 adds a bucket and rewrites every instance's
// Reason; v2 -> v3 records that it ran after v2.
func testSchema(runs *[]string, fail bool) *schema {
	v2 := func(tx *bbolt.Tx) error {
		*runs = append(*runs, "v2")
		if _, err := tx.CreateBucket([]byte("notes")); err != nil {
			return err
		}
		b := tx.Bucket([]byte(bucketInstances))
		err := b.ForEach(func(k, v []byte) error {
			return b.Put(k, bytes.Replace(v, []byte(`"reason":"old"`), []byte(`"reason":"migrated"`), 1))
		})
		if err == nil && fail {
			err = errors.New("test migration fails")
		}
		return err
	}
	v3 := func(tx *bbolt.Tx) error {
		*runs = append(*runs, "v3")
		return tx.Bucket([]byte("notes")).Put([]byte("after"), []byte("v2"))
	}
	return &schema{migrations: []migration{v2, v3}}
}

func TestMigration(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := Open(path, Options{schema: &schema{}}) // a schema 1 file
	if err != nil {
		t.Fatal(err)
	}
	mustUpdate(t, db, func(tx *Tx) error {
		acme, in := testTenant("acme"), testInstance("i-1", "acme")
		in.Reason = "old"
		if err := tx.PutTenant(&acme); err != nil {
			return err
		}
		return tx.PutInstance(&in)
	})
	db.Close()
	v1 := dump(t, path)

	var runs []string
	db, err = Open(path, Options{schema: testSchema(&runs, false)})
	if err != nil {
		t.Fatalf("Open with migrations: %v", err)
	}
	if !slices.Equal(runs, []string{"v2", "v3"}) || db.SchemaVersion() != 3 {
		t.Errorf("migrations ran %v to schema %d, want [v2 v3] to 3", runs, db.SchemaVersion())
	}
	mustView(t, db, func(tx *Tx) error {
		in, err := tx.Instance("i-1")
		if err != nil {
			return err
		}
		if in.Reason != "migrated" {
			t.Errorf("Reason = %q after migration, want \"migrated\"", in.Reason)
		}
		return nil
	})
	db.Close()
	if got := rawSchema(t, path); got != "3" {
		t.Errorf("meta/schema = %q, want \"3\"", got)
	}
	rawView(t, path, func(tx *bbolt.Tx) error {
		if got := string(tx.Bucket([]byte("notes")).Get([]byte("after"))); got != "v2" {
			t.Errorf("notes/after = %q, want \"v2\"", got)
		}
		return nil
	})

	// The backup is the file as it was before migrating.
	backup := backupPath(path, 1)
	if !strings.HasSuffix(backup, "state.db.v1.bak") {
		t.Errorf("backup path %s, want state.db.v1.bak", backup)
	}
	if got := dump(t, backup); !maps.Equal(got, v1) {
		t.Errorf("backup holds %v, want the file's content before migrating, %v", got, v1)
	}
	if names := dirNames(t, filepath.Dir(path)); !slices.Equal(names, []string{"state.db", "state.db.v1.bak"}) {
		t.Errorf("directory holds %v, want state.db and state.db.v1.bak", names)
	}
	bdb, err := Open(backup, Options{})
	if err != nil {
		t.Fatalf("Open backup: %v", err)
	}
	mustView(t, bdb, func(tx *Tx) error {
		in, err := tx.Instance("i-1")
		if err == nil && in.Reason != "old" {
			t.Errorf("backup Reason = %q, want \"old\"", in.Reason)
		}
		return err
	})
	bdb.Close()

	// Opening again runs nothing; an older vgpud refuses the file.
	runs = nil
	db, err = Open(path, Options{schema: testSchema(&runs, false)})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	if len(runs) != 0 {
		t.Errorf("second Open ran migrations %v", runs)
	}
	if _, err := Open(path, Options{}); !errors.Is(err, ErrNewerSchema) {
		t.Errorf("Open with this build's schema = %v, want ErrNewerSchema", err)
	}
}

func TestMigrationFailureRollsBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	populatedAt(t, path, 5, &schema{})
	before := readFile(t, path)

	var runs []string
	_, err := Open(path, Options{schema: testSchema(&runs, true)})
	if !errors.Is(err, ErrSchema) {
		t.Fatalf("Open = %v, want ErrSchema", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "test migration fails") || !strings.Contains(msg, "state.db.v1.bak") {
		t.Errorf("message %q should give the cause and the backup", msg)
	}
	if !slices.Equal(runs, []string{"v2"}) {
		t.Errorf("migrations ran %v, want [v2]", runs)
	}
	if !bytes.Equal(readFile(t, path), before) {
		t.Error("file changed by a failed migration")
	}
	if got, want := dump(t, backupPath(path, 1)), dump(t, path); !maps.Equal(got, want) {
		t.Errorf("backup holds %v, want the file's content before migrating, %v", got, want)
	}
	db, err := Open(path, Options{schema: &schema{}})
	if err != nil {
		t.Fatalf("Open at schema 1 after the failed migration: %v", err)
	}
	db.Close()
}

// A schema 1 file (vgpud's first release) is migrated to this build's
// schema: its records kept, the GPU state bucket added, a backup beside it.
func TestProductionMigrationFromSchema1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	populatedAt(t, path, 3, &schema{})
	v1 := dump(t, path)
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open a schema 1 file: %v", err)
	}
	mustView(t, db, func(tx *Tx) error {
		ins, err := tx.Instances()
		if err == nil && len(ins) != 3 {
			t.Errorf("%d instances after migrating, want 3", len(ins))
		}
		return err
	})
	on := true
	mustUpdate(t, db, func(tx *Tx) error {
		return tx.PutGPU(GPU{UUID: "GPU-1", Failed: "XID 79", Heterogeneous: &on})
	})
	mustView(t, db, func(tx *Tx) error {
		g, err := tx.GPU("GPU-1")
		if err == nil && (g.Failed != "XID 79" || g.Heterogeneous == nil || !*g.Heterogeneous || g.Updated.IsZero()) {
			t.Errorf("GPU state read back as %+v", g)
		}
		return err
	})
	// A state with nothing in it is not kept.
	mustUpdate(t, db, func(tx *Tx) error { return tx.PutGPU(GPU{UUID: "GPU-1"}) })
	mustView(t, db, func(tx *Tx) error {
		if _, err := tx.GPU("GPU-1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("empty GPU state kept: %v", err)
		}
		return nil
	})
	db.Close()
	if got, want := rawSchema(t, path), strconv.Itoa(SchemaVersion); got != want {
		t.Errorf("meta/schema = %q, want %q", got, want)
	}
	if got := dump(t, backupPath(path, 1)); !maps.Equal(got, v1) {
		t.Errorf("backup holds %v, want the schema 1 content %v", got, v1)
	}
}

func TestNewFileRunsEveryMigration(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	var runs []string
	db, err := Open(path, Options{schema: testSchema(&runs, false)})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	if !slices.Equal(runs, []string{"v2", "v3"}) || rawSchema(t, path) != "3" {
		t.Errorf("new file: migrations %v, schema %q; want [v2 v3], 3", runs, rawSchema(t, path))
	}
	if names := dirNames(t, filepath.Dir(path)); !slices.Equal(names, []string{"state.db"}) {
		t.Errorf("directory holds %v, want only state.db (nothing to back up)", names)
	}
}
