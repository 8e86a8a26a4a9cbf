package tenant

import (
	"errors"
	"testing"
)

// The seeds cover every unit, the edges of uint64 and the malformed shapes
// the table tests refuse; the fuzzer mutates from there.
var quantitySeeds = []string{
	"0", "1", "512B", "80GiB", "80G", "80Gi", "80GB", "1.5KiB", "1.1GiB", "0.5", "2.5", "2500m", "0.0005",
	"unlimited", "UNLIMITED", "18446744073709551615", "18446744073709551616", "16384PiB", "-1", "+1",
	"NaN", "Inf", "1e9", "80 GiB", " 7 ", "80.", ".5", "1,5", "2500mm", "0x10", "", "   ", "٨٠",
}

func FuzzParseBytes(f *testing.F) {
	for _, s := range quantitySeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseBytes(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidQuantity) {
				t.Fatalf("ParseBytes(%q) error %v does not wrap ErrInvalidQuantity", s, err)
			}
			return
		}
		out := FormatBytes(v)
		back, err := ParseBytes(out)
		if err != nil || back != v {
			t.Fatalf("ParseBytes(%q) = %d; FormatBytes = %q; parsed back %d, %v", s, v, out, back, err)
		}
	})
}

func FuzzParseCompute(f *testing.F) {
	for _, s := range quantitySeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseCompute(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidQuantity) {
				t.Fatalf("ParseCompute(%q) error %v does not wrap ErrInvalidQuantity", s, err)
			}
			return
		}
		out := FormatCompute(v)
		back, err := ParseCompute(out)
		if err != nil || back != v {
			t.Fatalf("ParseCompute(%q) = %d; FormatCompute = %q; parsed back %d, %v", s, v, out, back, err)
		}
	})
}

// FuzzFormat checks the other direction: every uint64 formats to a string
// that parses back to it.
func FuzzFormat(f *testing.F) {
	for _, v := range []uint64{0, 1, 999, 1000, 1024, 1536, 80 << 30, 80e9, 1<<63 + 1, Unlimited - 1, Unlimited} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v uint64) {
		if back, err := ParseBytes(FormatBytes(v)); err != nil || back != v {
			t.Fatalf("bytes %d: FormatBytes = %q, parsed back %d, %v", v, FormatBytes(v), back, err)
		}
		if back, err := ParseCompute(FormatCompute(v)); err != nil || back != v {
			t.Fatalf("compute %d: FormatCompute = %q, parsed back %d, %v", v, FormatCompute(v), back, err)
		}
	})
}
