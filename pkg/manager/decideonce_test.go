package manager_test

import (
	"context"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
)

// hookFleet accepts every claim, running hook (once) while the create
// that claimed waits between its claim and its admission.
type hookFleet struct {
	*recordingFleet
	hook func()
}

func (f *hookFleet) Claim(context.Context, manager.FleetClaim) error {
	// The hook's own create claims too: it runs with the hook taken.
	if h := f.hook; h != nil {
		f.hook = nil
		h()
	}
	return nil
}

// TestCreateDecidesOnce: a create that claims in the fleet decides where
// to carve once, for the claim, and the admission under the lock takes
// that decision again while nothing changed meanwhile. When something did
// change (another create took the slot the claim was decided for), the
// admission decides anew on the claimed GPU and carves beside it.
func TestCreateDecidesOnce(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	f := &hookFleet{recordingFleet: &recordingFleet{claimOK: true}}
	e.m.SetFleet(f)
	defer e.m.SetFleet(nil)

	before := manager.Decisions(e.m)
	first := e.mustCreate("acme", "1g.10gb", "")
	if n := manager.Decisions(e.m) - before; n != 1 {
		t.Fatalf("a create decided %d times; want once", n)
	}

	var meanwhile manager.FleetClaim
	f.hook = func() {
		r := e.mustCreate("acme", "1g.10gb", sim.DefaultH100MIG)
		meanwhile.Instance, meanwhile.GPU = r.UUID, r.GPUUUID
		if r.GIStart == first.GIStart {
			t.Errorf("the create made meanwhile took %s's slot %d", first.UUID, r.GIStart)
		}
	}
	before = manager.Decisions(e.m)
	second := e.mustCreate("acme", "1g.10gb", sim.DefaultH100MIG)
	// The create made meanwhile decided once; this one for its claim and
	// again under the lock, as the host had changed.
	if n := manager.Decisions(e.m) - before; n != 3 {
		t.Fatalf("a create and one made between its claim and its admission decided %d times; want 3", n)
	}
	other, err := e.m.Instance(meanwhile.Instance)
	if err != nil {
		t.Fatal(err)
	}
	if second.GPUUUID != other.GPUUUID || second.GIStart == other.GIStart || second.GIStart == first.GIStart {
		t.Fatalf("the create carved at %s slot %d beside %s slot %d and %s slot %d", second.GPUPCI, second.GIStart, other.UUID, other.GIStart, first.UUID, first.GIStart)
	}
}
