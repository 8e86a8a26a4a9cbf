package fleet

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The tests' view of the syncer's counters and bookkeeping.

func writeFailuresOf(s *Syncer, write, kind string) prometheus.Counter {
	return s.met.writeFailures.WithLabelValues(write, kind)
}

func settlesOf(s *Syncer, outcome string) prometheus.Counter {
	return s.met.settles.WithLabelValues(outcome)
}

// bookkeeping describes the syncer's entries about consumers ("" none).
func bookkeeping(s *Syncer) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.seen)+len(s.gone)+len(s.settled) == 0 {
		return ""
	}
	return fmt.Sprintf("seen %v gone %v settled %v", s.seen, s.gone, s.settled)
}

func withSettleTimeout(cfg Config, d time.Duration) Config {
	cfg.SettleTimeout = d
	return cfg
}
