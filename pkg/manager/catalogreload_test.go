package manager_test

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

// TestRecordOfADroppedModel: a reload whose catalog no longer has a
// record's GPU model (a profiles.d file removed) makes operations that
// need the model fail with a named error that says what to do, never a
// panic.
func TestRecordOfADroppedModel(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.tenant("acme", unlimited())
	r := e.mustCreate("acme", "A10-4Q", "")
	lv := &fuzzVirt{vms: map[string]*fuzzVM{"vm1": {uuid: "6f1ad3a0-0000-4000-8000-000000000001", devs: map[string]string{}}}}
	e.m.SetVirt(lv)

	without := fstest.MapFS{}
	err := fs.WalkDir(profiles.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") || strings.HasPrefix(path, "a10-") {
			return err
		}
		b, err := fs.ReadFile(profiles.FS, path)
		without[path] = &fstest.MapFile{Data: b}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	cat, err := profile.Load(without)
	if err != nil {
		t.Fatal(err)
	}
	e.m.SetCatalog(cat)
	_, err = e.m.Attach(ctx, r.UUID, "vm1", manager.AttachOptions{Display: true})
	if !errors.Is(err, manager.ErrBackendFailure) || !strings.Contains(manager.Message(err), "profiles.d") {
		t.Fatalf("attach with display of a dropped model's instance: %v", err)
	}
}
