package tenant

import (
	"errors"
	"strings"
	"testing"
)

func TestParseBytes(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want uint64
	}{
		{"plain bytes", "1073741824", 1 << 30},
		{"zero", "0", 0},
		{"B suffix", "512B", 512},
		{"GiB", "80GiB", 80 << 30},
		{"G is GiB", "80G", 80 << 30},
		{"Gi is GiB", "80Gi", 80 << 30},
		{"KiB", "4KiB", 4096},
		{"K", "4K", 4096},
		{"MiB", "81559MiB", 81559 << 20},
		{"TiB", "2TiB", 2 << 40},
		{"PiB", "1PiB", 1 << 50},
		{"kB", "1kB", 1000},
		{"KB", "1KB", 1000},
		{"MB", "5MB", 5e6},
		{"GB", "80GB", 80e9},
		{"TB", "3TB", 3e12},
		{"PB", "1PB", 1e15},
		{"fraction", "1.5GiB", 3 << 29},
		{"fraction KiB", "0.5KiB", 512},
		{"fraction GB", "1.1GB", 1.1e9},
		{"space before unit", "80 GiB", 80 << 30},
		{"surrounding space", "  80GiB\n", 80 << 30},
		{"leading zeros", "007MiB", 7 << 20},
		{"unlimited", "unlimited", Unlimited},
		{"unlimited any case", "Unlimited", Unlimited},
		{"max uint64", "18446744073709551615", Unlimited},
		{"largest finite", "18446744073709551614", Unlimited - 1},
		{"16383PiB", "16383PiB", 16383 << 50},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseBytes(tc.in)
			if err != nil || got != tc.want {
				t.Fatalf("ParseBytes(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestParseBytesErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		why  string
	}{
		{"empty", "", "empty"},
		{"spaces only", "   ", "empty"},
		{"negative", "-1GiB", "negative"},
		{"plus sign", "+1GiB", "does not start with a digit"},
		{"NaN", "NaN", "does not start with a digit"},
		{"Inf", "Inf", "does not start with a digit"},
		{"exponent", "1e9", `unknown unit "e9"`},
		{"hex", "0x10", `unknown unit "x10"`},
		{"overflow", "18446744073709551616", "too large"},
		{"overflow with unit", "16384PiB", "too large"},
		{"huge", "99999999999999999999999999999TiB", "too large"},
		{"trailing garbage", "80GiBs", `unknown unit "GiBs"`},
		{"trailing space garbage", "80GiB x", `unknown unit "GiB x"`},
		{"two numbers", "80 80", `unknown unit "80"`},
		{"lowercase unit", "80gib", `unknown unit "gib"`},
		{"lone dot", "80.", "no digit after the decimal point"},
		{"leading dot", ".5GiB", "does not start with a digit"},
		{"fractional bytes", "1.5", "not a whole number of bytes"},
		{"fractional KiB bytes", "1.1KiB", "not a whole number of bytes"},
		{"comma", "1,5GiB", `unknown unit ",5GiB"`},
		{"too long", strings.Repeat("1", 65), "longer than 64"},
		{"unicode digits", "٨٠GiB", "does not start with a digit"},
		{"milli", "5m", `unknown unit "m"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseBytes(tc.in)
			if !errors.Is(err, ErrInvalidQuantity) {
				t.Fatalf("ParseBytes(%q) = %d, %v; want ErrInvalidQuantity", tc.in, got, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.why) {
				t.Errorf("error %q does not say %q", msg, tc.why)
			}
			if !strings.Contains(msg, "GiB") || !strings.Contains(msg, `"unlimited"`) {
				t.Errorf("error %q does not list the accepted forms", msg)
			}
		})
	}
}

func TestParseCompute(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want uint64
	}{
		{"one GPU", "1", 1000},
		{"zero", "0", 0},
		{"fraction", "2.5", 2500},
		{"three decimals", "0.428", 428},
		{"trailing zeros past milli", "2.5000", 2500},
		{"milli", "2500m", 2500},
		{"milli space", "250 m", 250},
		{"milli fraction that is whole", "2500.0m", 2500},
		{"unlimited", "unlimited", Unlimited},
		{"UNLIMITED", "UNLIMITED", Unlimited},
		{"max milli", "18446744073709551615m", Unlimited},
		{"max GPUs", "18446744073709551.614", Unlimited - 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseCompute(tc.in)
			if err != nil || got != tc.want {
				t.Fatalf("ParseCompute(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestParseComputeErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		why  string
	}{
		{"empty", "", "empty"},
		{"negative", "-0.5", "negative"},
		{"NaN", "NaN", "does not start with a digit"},
		{"Inf", "+Inf", "does not start with a digit"},
		{"finer than milli", "0.0005", "not a whole number of milli-GPUs"},
		{"fractional milli", "2.5m", "not a whole number of milli-GPUs"},
		{"overflow", "18446744073709552", "too large"},
		{"overflow milli", "18446744073709551616m", "too large"},
		{"unit GPU", "2GPU", `unknown unit "GPU"`},
		{"percent", "50%", `unknown unit "%"`},
		{"trailing garbage", "2500mm", `unknown unit "mm"`},
		{"bytes unit", "1GiB", `unknown unit "GiB"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseCompute(tc.in)
			if !errors.Is(err, ErrInvalidQuantity) {
				t.Fatalf("ParseCompute(%q) = %d, %v; want ErrInvalidQuantity", tc.in, got, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.why) {
				t.Errorf("error %q does not say %q", msg, tc.why)
			}
			if !strings.Contains(msg, `"2500m"`) || !strings.Contains(msg, `"unlimited"`) {
				t.Errorf("error %q does not list the accepted forms", msg)
			}
		})
	}
}

func TestFormatBytes(t *testing.T) {
	tests := []struct {
		name string
		in   uint64
		want string
	}{
		{"zero", 0, "0B"},
		{"small", 1023, "1023B"},
		{"KiB", 1024, "1KiB"},
		{"kB", 1000, "1kB"},
		{"shorter in smaller unit", 1536, "1536B"},
		{"fraction GiB", 3 << 29, "1.5GiB"},
		{"fraction GB", 1.5e9, "1.5GB"},
		{"GiB", 80 << 30, "80GiB"},
		{"GB", 80e9, "80GB"},
		{"MiB not GiB", 81559 << 20, "81559MiB"},
		{"integer beats decimals", 1<<30 + 1<<30/8, "1152MiB"},
		{"tie goes binary", 1 << 50, "1PiB"},
		{"large", 16383 << 50, "16383PiB"},
		{"odd", 1<<30 + 1, "1073741825B"},
		{"unlimited", Unlimited, "unlimited"},
		{"largest finite", Unlimited - 1, "18446744073709551614B"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := FormatBytes(tc.in); got != tc.want {
				t.Fatalf("FormatBytes(%d) = %q, want %q", tc.in, got, tc.want)
			}
			if back, err := ParseBytes(tc.want); err != nil || back != tc.in {
				t.Fatalf("ParseBytes(%q) = %d, %v; want %d", tc.want, back, err, tc.in)
			}
		})
	}
}

func TestFormatCompute(t *testing.T) {
	tests := []struct {
		in   uint64
		want string
	}{
		{0, "0"},
		{1000, "1"},
		{2500, "2.5"},
		{428, "0.428"},
		{5, "0.005"},
		{1010, "1.01"},
		{Unlimited, "unlimited"},
		{Unlimited - 1, "18446744073709551.614"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			if got := FormatCompute(tc.in); got != tc.want {
				t.Fatalf("FormatCompute(%d) = %q, want %q", tc.in, got, tc.want)
			}
			if back, err := ParseCompute(tc.want); err != nil || back != tc.in {
				t.Fatalf("ParseCompute(%q) = %d, %v; want %d", tc.want, back, err, tc.in)
			}
		})
	}
}
