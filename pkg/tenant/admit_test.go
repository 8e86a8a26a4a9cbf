package tenant

import (
	"errors"
	"testing"
)

func TestAdmit(t *testing.T) {
	acme := Tenant{
		Name:  "acme",
		Class: Guaranteed,
		Quota: Quota{VRAMBytes: 80 << 30, ComputeMilli: 2500, MaxInstances: 4},
	}
	restricted := acme
	restricted.AllowedModels = []string{"H100-SXM5-80GB", "H200-SXM5-141GB"}
	restricted.AllowedProfiles = []string{"3g.40gb"}
	unlimited := acme
	unlimited.Quota = UnlimitedQuota()

	tests := []struct {
		name    string
		tenant  Tenant
		usage   Usage
		req     Request
		want    error
		message string
	}{
		{
			name:   "fits",
			tenant: acme,
			usage:  Usage{VRAMBytes: 40 << 30, ComputeMilli: 1000, Instances: 1},
			req:    Request{VRAMBytes: 40 << 30, ComputeMilli: 1500},
		},
		{
			name:   "fills exactly",
			tenant: acme,
			usage:  Usage{VRAMBytes: 60 << 30, ComputeMilli: 2000, Instances: 3},
			req:    Request{VRAMBytes: 20 << 30, ComputeMilli: 500},
		},
		{
			name:    "VRAM over",
			tenant:  acme,
			usage:   Usage{VRAMBytes: 60 << 30, Instances: 1},
			req:     Request{VRAMBytes: 40 << 30},
			want:    ErrQuotaExceeded,
			message: "tenant acme: VRAM quota 80GiB, used 60GiB, request 40GiB: 20GiB left",
		},
		{
			name:    "compute over",
			tenant:  acme,
			usage:   Usage{ComputeMilli: 2000},
			req:     Request{ComputeMilli: 571},
			want:    ErrQuotaExceeded,
			message: "tenant acme: compute quota 2.5 GPU, used 2 GPU, request 0.571 GPU: 0.5 GPU left",
		},
		{
			name:    "instances over",
			tenant:  acme,
			usage:   Usage{Instances: 4},
			req:     Request{},
			want:    ErrQuotaExceeded,
			message: "tenant acme: instance quota 4, used 4, request 1: 0 left",
		},
		{
			name:    "all over",
			tenant:  acme,
			usage:   Usage{VRAMBytes: 80 << 30, ComputeMilli: 2500, Instances: 4},
			req:     Request{VRAMBytes: 1 << 30, ComputeMilli: 1},
			want:    ErrQuotaExceeded,
			message: "tenant acme: VRAM quota 80GiB, used 80GiB, request 1GiB: 0B left; compute quota 2.5 GPU, used 2.5 GPU, request 0.001 GPU: 0 GPU left; instance quota 4, used 4, request 1: 0 left",
		},
		{
			name:    "usage above a lowered quota",
			tenant:  acme,
			usage:   Usage{VRAMBytes: 100 << 30},
			req:     Request{VRAMBytes: 0},
			want:    ErrQuotaExceeded,
			message: "tenant acme: VRAM quota 80GiB, used 100GiB, request 0B: 0B left",
		},
		{
			name:    "request overflows",
			tenant:  acme,
			usage:   Usage{VRAMBytes: 1},
			req:     Request{VRAMBytes: Unlimited - 1},
			want:    ErrQuotaExceeded,
			message: "tenant acme: VRAM quota 80GiB, used 1B, request 18446744073709551614B: 85899345919B left",
		},
		{
			name:   "unlimited takes anything",
			tenant: unlimited,
			usage:  Usage{VRAMBytes: Unlimited - 1, ComputeMilli: Unlimited, Instances: Unlimited},
			req:    Request{VRAMBytes: Unlimited, ComputeMilli: Unlimited},
		},
		{
			name:   "allowed model and profile",
			tenant: restricted,
			req:    Request{Model: "H200-SXM5-141GB", Profile: "3g.40gb"},
		},
		{
			name:    "model not allowed",
			tenant:  restricted,
			req:     Request{Model: "A100-SXM4-80GB", Profile: "3g.40gb"},
			want:    ErrNotAllowed,
			message: `tenant acme: not allowed: model "A100-SXM4-80GB" is not in its allowed models (H100-SXM5-80GB, H200-SXM5-141GB)`,
		},
		{
			name:    "profile not allowed",
			tenant:  restricted,
			req:     Request{Model: "H100-SXM5-80GB", Profile: "7g.80gb"},
			want:    ErrNotAllowed,
			message: `tenant acme: not allowed: profile "7g.80gb" is not in its allowed profiles (3g.40gb)`,
		},
		{
			name:    "not allowed wins over quota",
			tenant:  restricted,
			usage:   Usage{Instances: 4},
			req:     Request{Model: "A100-SXM4-80GB", Profile: "3g.40gb"},
			want:    ErrNotAllowed,
			message: `tenant acme: not allowed: model "A100-SXM4-80GB" is not in its allowed models (H100-SXM5-80GB, H200-SXM5-141GB)`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.tenant.Admit(tc.usage, tc.req)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Admit() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Admit() = %v, want %v", err, tc.want)
			}
			if err.Error() != tc.message {
				t.Errorf("message\n got %q\nwant %q", err.Error(), tc.message)
			}
		})
	}
}

func TestQuotaErrorFigures(t *testing.T) {
	acme := Tenant{Name: "acme", Class: Guaranteed, Quota: Quota{VRAMBytes: 80 << 30, ComputeMilli: Unlimited, MaxInstances: Unlimited}}
	err := acme.Admit(Usage{VRAMBytes: 60 << 30}, Request{VRAMBytes: 40 << 30})
	var qe *QuotaError
	if !errors.As(err, &qe) {
		t.Fatalf("Admit() = %v, want a *QuotaError", err)
	}
	want := Overage{Resource: ResourceVRAM, Quota: 80 << 30, Used: 60 << 30, Request: 40 << 30}
	if qe.Tenant != "acme" || len(qe.Over) != 1 || qe.Over[0] != want {
		t.Fatalf("QuotaError = %+v, want tenant acme and %+v", qe, want)
	}
	if got := qe.Over[0].Left(); got != 20<<30 {
		t.Errorf("Left() = %d, want %d", got, uint64(20<<30))
	}
}
