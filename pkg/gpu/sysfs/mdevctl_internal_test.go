package sysfs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// TestMdevctlReadDeadline: a directory whose read does not return (a file
// system that does not answer) is reported once its deadline passes,
// and while that read is still blocked no other is started: discovery
// goes on without mdevctl's definitions. Once it returns, reads resume.
func TestMdevctlReadDeadline(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 8)
	mdevctlTimeout = 10 * time.Millisecond
	mdevctlReadDir = func(ctx context.Context, dir string) ([]gpu.MdevctlDefinition, error) {
		started <- struct{}{}
		<-release
		return readMdevctlDir(ctx, dir)
	}
	t.Cleanup(func() { mdevctlTimeout, mdevctlReadDir = MdevctlReadTimeout, readMdevctlDir })
	s := New(OSFS{Root: t.TempDir()}).WithMdevctl(t.TempDir())
	if _, err := s.readMdevctl(); !errors.Is(err, ErrMdevctlTimeout) {
		t.Fatalf("blocked read: %v, want ErrMdevctlTimeout", err)
	}
	if _, err := s.readMdevctl(); !errors.Is(err, ErrMdevctlTimeout) {
		t.Fatalf("read while one is blocked: %v, want ErrMdevctlTimeout", err)
	}
	if n := len(started); n != 1 {
		t.Fatalf("%d reads started while the first was blocked, want 1", n)
	}
	close(release)
	for {
		s.mdevctlMu.Lock()
		stuck := s.mdevctlStuck
		s.mdevctlMu.Unlock()
		if stuck == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	mdevctlTimeout = time.Minute
	if defs, err := s.readMdevctl(); err != nil || defs != nil {
		t.Fatalf("read after the blocked one returned: %v, %v", defs, err)
	}
}
