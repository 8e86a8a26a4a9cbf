package manager_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/virt"
)

// hungVirt is a libvirtd that accepts calls and never answers: each call
// waits for its context and records the deadline it was given.
type hungVirt struct {
	unreachableVirt
	deadlines chan time.Duration
}

func (v *hungVirt) wait(ctx context.Context) error {
	d, ok := ctx.Deadline()
	if !ok {
		d = time.Now().Add(time.Hour) // no deadline: reported as an hour
	}
	v.deadlines <- time.Until(d)
	<-ctx.Done()
	return ctx.Err()
}

func (v *hungVirt) Domains(ctx context.Context) ([]virt.Domain, error) { return nil, v.wait(ctx) }
func (v *hungVirt) Attached(ctx context.Context, _ string) ([]virt.Attached, error) {
	return nil, v.wait(ctx)
}

// TestReconcileLibvirtDownIsPending: with libvirtd gone, or hung, reconcile
// answers with the host pass done and the libvirt part reported pending,
// having asked libvirt once under a short deadline instead of running the
// libvirt pass into its own.
func TestReconcileLibvirtDownIsPending(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	e.mustCreate("acme", "L4-4Q", "")

	t.Run("unreachable", func(t *testing.T) {
		lv := &unreachableVirt{}
		e.m.SetVirt(lv)
		rep, err := e.m.Reconcile(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !pendingLibvirt(rep.Pending, "unreachable") {
			t.Fatalf("pending %q: want the libvirt pass reported pending as unreachable", rep.Pending)
		}
		if n := lv.calls.Load(); n != 1 {
			t.Fatalf("%d libvirt calls, want the one probe", n)
		}
	})

	t.Run("hung", func(t *testing.T) {
		lv := &hungVirt{deadlines: make(chan time.Duration, 16)}
		e.m.SetVirt(lv)
		rep, err := e.m.Reconcile(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !pendingLibvirt(rep.Pending, "did not answer") {
			t.Fatalf("pending %q: want the libvirt pass reported pending as not answering", rep.Pending)
		}
		close(lv.deadlines)
		var got []time.Duration
		for d := range lv.deadlines {
			got = append(got, d)
		}
		// One probe, bounded well under the pass's minute.
		if len(got) != 1 || got[0] > 10*time.Second {
			t.Fatalf("libvirt asked with deadlines %v, want one call bounded by a few seconds", got)
		}
	})

	t.Run("answers again", func(t *testing.T) {
		e.m.SetVirt(&answeringVirt{})
		rep, err := e.m.Reconcile(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Pending) != 0 {
			t.Fatalf("pending %q with libvirt answering", rep.Pending)
		}
	})
}

// answeringVirt is a libvirtd with no domains.
type answeringVirt struct{ unreachableVirt }

func (v *answeringVirt) Domains(context.Context) ([]virt.Domain, error) { return nil, nil }

func pendingLibvirt(pending []string, why string) bool {
	for _, p := range pending {
		if strings.HasPrefix(p, "libvirt: ") && strings.Contains(p, why) {
			return true
		}
	}
	return false
}
