package dbusapi

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
)

// TestCancelledNamesTheDeadline checks the reply of an operation the
// caller's deadline cut off: the client names the same deadline Timeout
// when its own timer fires first, so the daemon's reply must too, or the
// name would depend on load. A refusal decided before the deadline keeps
// its own name.
func TestCancelledNamesTheDeadline(t *testing.T) {
	expired, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-expired.Done()
	stopped, stop := context.WithCancel(context.Background())
	stop()

	cutOff := fmt.Errorf("create 1g.10gb: %w: %w", manager.ErrBackendFailure,
		fmt.Errorf("NVML CreateGpuInstanceWithPlacement: %w: %w", gpu.ErrTimeout, context.DeadlineExceeded))
	cancelledCall := fmt.Errorf("create 1g.10gb: %w: %w", manager.ErrBackendFailure, context.Canceled)
	refused := fmt.Errorf("tenant acme: %w", manager.ErrQuotaExceeded)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want string
	}{
		{"driver call cut off at the deadline", expired, cutOff, NameTimeout},
		{"driver call cut off by Cancel", stopped, cancelledCall, NameTimeout},
		{"refusal before the deadline", expired, refused, NameQuotaExceeded},
		{"context still live", context.Background(), cutOff, NameBackendFailure},
	} {
		t.Run(tc.name, func(t *testing.T) {
			de := toDBusError(cancelled(tc.ctx, tc.err))
			if de.Name != ErrorPrefix+tc.want {
				t.Fatalf("name %s, want %s%s", de.Name, ErrorPrefix, tc.want)
			}
			if got := ErrorName(fromDBus(context.Background(), "create", de)); got != tc.want {
				t.Fatalf("the client reads %s, want %s", got, tc.want)
			}
		})
	}
}
