package hostcall

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestReturnsTheAnswer(t *testing.T) {
	var tr Tracker
	v, err := Go(context.Background(), &tr, func() int { return 7 })
	if v != 7 || err != nil || tr.Abandoned() != 0 {
		t.Fatalf("Go = %d, %v; abandoned %d", v, err, tr.Abandoned())
	}
}

// A call past its deadline is counted until it returns, and Quiesce waits
// for it.
func TestQuiesceWaitsForAbandonedCalls(t *testing.T) {
	var tr Tracker
	release := make(chan struct{})
	ran := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Go(ctx, &tr, func() int { <-release; close(ran); return 1 })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if tr.Abandoned() != 1 {
		t.Fatalf("abandoned = %d, want 1", tr.Abandoned())
	}
	short, cancelShort := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancelShort()
	if err := tr.Quiesce(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Quiesce with the call running = %v, want DeadlineExceeded", err)
	}
	quiesced := make(chan error, 1)
	go func() { quiesced <- tr.Quiesce(context.Background()) }()
	close(release)
	<-ran
	if err := <-quiesced; err != nil {
		t.Fatalf("Quiesce = %v", err)
	}
	if tr.Abandoned() != 0 {
		t.Fatalf("abandoned = %d after the call returned", tr.Abandoned())
	}
	if err := tr.Quiesce(context.Background()); err != nil {
		t.Fatalf("Quiesce with nothing running = %v", err)
	}
}
