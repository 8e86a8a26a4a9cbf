package tenant

import (
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
)

// ErrInvalidQuantity is wrapped by ParseBytes's and ParseCompute's errors;
// the message names the input, what is wrong with it and the accepted forms.
var ErrInvalidQuantity = errors.New("invalid quantity")

// Accepted forms, quoted in every parse error so a user can fix the input
// without reading the documentation.
const (
	bytesForms = `a whole number of bytes ("1073741824", "512B"); a number with a binary unit, ` +
		`powers of 1024: KiB MiB GiB TiB PiB, also written Ki Mi Gi Ti Pi or K M G T P ("80GiB", "80G", "1.5Ti"); ` +
		`a number with a decimal unit, powers of 1000: kB (or KB) MB GB TB PB ("80GB"); or "unlimited"`
	computeForms = `GPUs with up to 3 decimals ("1", "2.5", "0.125"); milli-GPUs with an "m" suffix ("2500m"); or "unlimited"`
)

// maxQuantityLen bounds the input so a hostile string cannot make the exact
// (arbitrary-precision) arithmetic below expensive. 64 characters hold any
// uint64 with a fraction and a unit.
const maxQuantityLen = 64

// byteUnits maps every accepted byte-unit spelling to its size. Units are
// case-sensitive: "mb" could mean millibits, so only the spellings people
// write for memory are accepted.
//
// A bare single letter (K, M, G, T, P) is binary, as in QEMU's "-m 80G",
// libvirt's memory units and coreutils: the memory a hypervisor host hands
// out is counted in powers of 1024. Only the explicit SI spellings (kB, MB,
// GB, ...) are powers of 1000. Kubernetes reads "80G" as 80e9; a user coming
// from there should write "80GB" for that.
var byteUnits = map[string]uint64{
	"": 1, "B": 1,
	"K": 1 << 10, "Ki": 1 << 10, "KiB": 1 << 10,
	"M": 1 << 20, "Mi": 1 << 20, "MiB": 1 << 20,
	"G": 1 << 30, "Gi": 1 << 30, "GiB": 1 << 30,
	"T": 1 << 40, "Ti": 1 << 40, "TiB": 1 << 40,
	"P": 1 << 50, "Pi": 1 << 50, "PiB": 1 << 50,
	"kB": 1e3, "KB": 1e3,
	"MB": 1e6,
	"GB": 1e9,
	"TB": 1e12,
	"PB": 1e15,
}

// formatUnits are the units FormatBytes may print, largest first within
// each family, binary before decimal so a tie goes to the binary spelling.
var formatUnits = []struct {
	name string
	size uint64
}{
	{"PiB", 1 << 50}, {"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"PB", 1e15}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"kB", 1e3},
}

// ParseBytes parses a byte quantity: plain bytes, a number with a binary
// or decimal unit (see byteUnits for the spellings, and why "G" is GiB), or
// "unlimited" (any case) for Unlimited. A fraction is allowed with a unit as
// long as it comes to a whole number of bytes ("1.5KiB" is 1536; "1.1KiB"
// is refused rather than rounded, so a quota is never silently changed).
// Surrounding spaces and spaces between number and unit are ignored.
//
// Negative numbers, NaN, Inf, exponents, values above the largest uint64,
// an empty string and anything after the unit are refused with an error
// wrapping ErrInvalidQuantity.
func ParseBytes(s string) (uint64, error) {
	return parseQuantity(s, "bytes", bytesForms, func(unit string) (uint64, bool) {
		size, ok := byteUnits[unit]
		return size, ok
	})
}

// ParseCompute parses a compute quantity into milli-GPU (1000 = one whole
// GPU): a number of GPUs with up to three decimals ("2.5" is 2500), a
// number of milli-GPUs with an "m" suffix ("2500m"), or "unlimited" (any
// case). A value finer than one milli-GPU is refused, not rounded. Errors
// wrap ErrInvalidQuantity, as for ParseBytes.
func ParseCompute(s string) (uint64, error) {
	return parseQuantity(s, "milli-GPUs", computeForms, func(unit string) (uint64, bool) {
		switch unit {
		case "":
			return 1000, true
		case "m":
			return 1, true
		}
		return 0, false
	})
}

// parseQuantity is the shared grammar: [spaces] digits [. digits] [spaces]
// unit [spaces], or "unlimited". The value is computed exactly with big
// integers; floats never enter, so there is no NaN, Inf or rounding to
// worry about.
func parseQuantity(s, whole, forms string, unitSize func(string) (uint64, bool)) (uint64, error) {
	bad := func(why string) error {
		return fmt.Errorf("%w %q: %s; accepted: %s", ErrInvalidQuantity, s, why, forms)
	}
	if len(s) > maxQuantityLen {
		return 0, bad(fmt.Sprintf("longer than %d characters", maxQuantityLen))
	}
	t := strings.TrimSpace(s)
	switch {
	case t == "":
		return 0, bad("empty")
	case strings.EqualFold(t, "unlimited"):
		return Unlimited, nil
	case t[0] == '-':
		return 0, bad("negative")
	}
	intPart, rest := splitDigits(t)
	if intPart == "" {
		return 0, bad("does not start with a digit")
	}
	var frac string
	if strings.HasPrefix(rest, ".") {
		frac, rest = splitDigits(rest[1:])
		if frac == "" {
			return 0, bad("no digit after the decimal point")
		}
	}
	unit := strings.TrimLeft(rest, " \t")
	size, ok := unitSize(unit)
	if !ok {
		return 0, bad(fmt.Sprintf("unknown unit %q", unit))
	}
	// value = (intPart.frac) * size = digits * size / 10^len(frac)
	n, _ := new(big.Int).SetString(intPart+frac, 10)
	n.Mul(n, new(big.Int).SetUint64(size))
	scale := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(frac))), nil)
	q, r := new(big.Int).QuoRem(n, scale, new(big.Int))
	if r.Sign() != 0 {
		return 0, bad("not a whole number of " + whole)
	}
	if !q.IsUint64() {
		return 0, bad("too large")
	}
	return q.Uint64(), nil
}

// splitDigits splits s after its leading ASCII digits.
func splitDigits(s string) (digits, rest string) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i], s[i:]
}

// FormatBytes renders v so that ParseBytes gives v back: "unlimited" for
// Unlimited, otherwise the shortest exact spelling with a unit and at most
// three decimals ("80GiB", "1.5KiB", "80GB"), binary units winning ties,
// and plain bytes ("1234B") when no unit is exact.
func FormatBytes(v uint64) string {
	if v == Unlimited {
		return "unlimited"
	}
	best := strconv.FormatUint(v, 10) + "B"
	for _, u := range formatUnits {
		if v < u.size {
			continue
		}
		if s, ok := exactDecimal(v, u.size); ok && len(s)+len(u.name) < len(best) {
			best = s + u.name
		}
	}
	return best
}

// FormatCompute renders milli-GPUs as GPUs with up to three decimals
// ("2.5", "0.428", "3"), or "unlimited"; ParseCompute gives v back.
func FormatCompute(v uint64) string {
	if v == Unlimited {
		return "unlimited"
	}
	s, _ := exactDecimal(v, 1000)
	return s
}

// exactDecimal writes v/unit with at most three decimals, trailing zeros
// trimmed, and reports whether that is exact. unit must be at most 2^50 so
// the remainder times 1000 cannot overflow.
func exactDecimal(v, unit uint64) (string, bool) {
	q, r := v/unit, v%unit
	if r == 0 {
		return strconv.FormatUint(q, 10), true
	}
	if r*1000%unit != 0 {
		return "", false
	}
	frac := fmt.Sprintf("%03d", r*1000/unit)
	return strconv.FormatUint(q, 10) + "." + strings.TrimRight(frac, "0"), true
}

// formatCount renders an instance count, Unlimited as "unlimited".
func formatCount(v uint64) string {
	if v == Unlimited {
		return "unlimited"
	}
	return strconv.FormatUint(v, 10)
}
