package gpu

import "testing"

// The driver's masks read as the states and limits they name.
func TestCompatibilityNames(t *testing.T) {
	for c, want := range map[VMCompatibility]string{CompatNone: "none", CompatLive: "live", CompatCold | CompatHibernate | CompatSleep | CompatLive: "cold,hibernate,sleep,live"} {
		if got := c.String(); got != want {
			t.Errorf("%d: %q, want %q", uint32(c), got, want)
		}
	}
	for l, want := range map[CompatLimit]string{LimitNone: "none", LimitHostDriver | LimitGuestDriver: "host driver,guest driver", LimitOther: "other", LimitGPU: "GPU"} {
		if got := l.String(); got != want {
			t.Errorf("%#x: %q, want %q", uint32(l), got, want)
		}
	}
}
