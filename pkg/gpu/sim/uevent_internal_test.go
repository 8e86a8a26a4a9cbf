package sim

import (
	"testing"
)

// UeventsSince finds the first event after a sequence number in the ring,
// also once the ring has wrapped.
func TestUeventsSince(t *testing.T) {
	h := openDefault(t)
	// One mutation: 5000 fsynced ones would take a minute.
	if err := h.mutate(func(st *state) (bool, error) {
		for i := 0; i < 5000; i++ {
			st.uevent("change", "devices/x", "pci", nil)
		}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		after    uint64
		n        int
		firstSeq uint64
	}{
		{0, maxUevents, 5000 - maxUevents + 1},
		{5000 - maxUevents, maxUevents, 5000 - maxUevents + 1},
		{4000, 1000, 4001},
		{4999, 1, 5000},
		{5000, 0, 0},
		{9999, 0, 0},
	} {
		evs, newest, err := h.UeventsSince(tt.after)
		if err != nil || newest != 5000 || len(evs) != tt.n {
			t.Fatalf("UeventsSince(%d) = %d events, newest %d, %v; want %d, 5000", tt.after, len(evs), newest, err, tt.n)
		}
		if tt.n > 0 && (evs[0].Seq != tt.firstSeq || evs[len(evs)-1].Seq != 5000) {
			t.Fatalf("UeventsSince(%d) = %d..%d, want %d..5000", tt.after, evs[0].Seq, evs[len(evs)-1].Seq, tt.firstSeq)
		}
	}
}
