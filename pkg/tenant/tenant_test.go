package tenant

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateName(t *testing.T) {
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{"simple", "acme", true},
		{"digits and dash", "team-42", true},
		{"starts with digit", "4acme", true},
		{"single char", "a", true},
		{"63 chars", strings.Repeat("a", 63), true},
		{"empty", "", false},
		{"64 chars", strings.Repeat("a", 64), false},
		{"uppercase", "Acme", false},
		{"leading dash", "-acme", false},
		{"trailing dash", "acme-", false},
		{"underscore", "ac_me", false},
		{"dot", "ac.me", false},
		{"space", "ac me", false},
		{"non-ascii", "acmé", false},
		{"slash", "a/b", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateName(tc.in)
			if tc.ok && err != nil {
				t.Fatalf("ValidateName(%q) = %v, want nil", tc.in, err)
			}
			if !tc.ok && !errors.Is(err, ErrInvalidName) {
				t.Fatalf("ValidateName(%q) = %v, want ErrInvalidName", tc.in, err)
			}
		})
	}
}

func TestTenantValidate(t *testing.T) {
	good := Tenant{Name: "acme", Class: Guaranteed, Quota: UnlimitedQuota()}
	tests := []struct {
		name   string
		mutate func(*Tenant)
		want   error
	}{
		{"valid", func(*Tenant) {}, nil},
		{"best effort", func(t *Tenant) { t.Class = BestEffort }, nil},
		{"allowed lists", func(t *Tenant) { t.AllowedModels = []string{"H100-SXM5-80GB"}; t.AllowedProfiles = []string{"3g.40gb"} }, nil},
		{"bad name", func(t *Tenant) { t.Name = "ACME" }, ErrInvalidName},
		{"empty class", func(t *Tenant) { t.Class = "" }, ErrInvalidTenant},
		{"unknown class", func(t *Tenant) { t.Class = "gold" }, ErrInvalidTenant},
		{"empty model", func(t *Tenant) { t.AllowedModels = []string{""} }, ErrInvalidTenant},
		{"duplicate profile", func(t *Tenant) { t.AllowedProfiles = []string{"1g.10gb", "1g.10gb"} }, ErrInvalidTenant},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tn := good
			tc.mutate(&tn)
			err := tn.Validate()
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("Validate() = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestParseClass(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Class
		ok   bool
	}{
		{"guaranteed", Guaranteed, true},
		{"best-effort", BestEffort, true},
		{"Guaranteed", "", false},
		{"", "", false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseClass(tc.in)
			if got != tc.want || (err == nil) != tc.ok {
				t.Fatalf("ParseClass(%q) = %q, %v; want %q, ok=%v", tc.in, got, err, tc.want, tc.ok)
			}
		})
	}
}

func TestQuotaString(t *testing.T) {
	q := Quota{VRAMBytes: 80 << 30, ComputeMilli: 2500, MaxInstances: 4}
	if got, want := q.String(), "vram=80GiB compute=2.5 instances=4"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got, want := UnlimitedQuota().String(), "vram=unlimited compute=unlimited instances=unlimited"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestEntitledCompute(t *testing.T) {
	tests := []struct {
		name string
		got  uint64
		want uint64
	}{
		{"MIG 3 of 7", MIGComputeMilli(3, 7), 428},
		{"MIG 1 of 7", MIGComputeMilli(1, 7), 142},
		{"MIG 7 of 7", MIGComputeMilli(7, 7), 1000},
		{"MIG 2 of 8", MIGComputeMilli(2, 8), 250},
		{"MIG 0 slices", MIGComputeMilli(0, 7), 0},
		{"MIG more slices than grid", MIGComputeMilli(8, 7), 0},
		{"MIG negative slices", MIGComputeMilli(-1, 7), 0},
		{"MIG zero grid", MIGComputeMilli(1, 0), 0},
		{"time-sliced 1", TimeSlicedComputeMilli(1), 1000},
		{"time-sliced 3", TimeSlicedComputeMilli(3), 333},
		{"time-sliced 16", TimeSlicedComputeMilli(16), 62},
		{"time-sliced 0", TimeSlicedComputeMilli(0), 0},
		{"time-sliced negative", TimeSlicedComputeMilli(-4), 0},
		{"passthrough", PassthroughComputeMilli, 1000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Fatalf("got %d, want %d", tc.got, tc.want)
			}
		})
	}
	// Rounding down keeps a full GPU's instances within one GPU.
	var sum uint64
	for range 7 {
		sum += MIGComputeMilli(1, 7)
	}
	if sum > 1000 {
		t.Errorf("seven 1/7 slices sum to %d > 1000", sum)
	}
}
