package placement

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// h100Types is a part of the H100 time-sliced table (reference 4.3).
func h100Types() map[string]VGPUTypeCap {
	return map[string]VGPUTypeCap{
		"H100XM-80C": {Max: 1, FramebufferMiB: 81920},
		"H100XM-40C": {Max: 2, FramebufferMiB: 40960},
		"H100XM-20C": {Max: 4, FramebufferMiB: 20480},
		"H100XM-8C":  {Max: 10, MaxMixed: 8, FramebufferMiB: 8192},
	}
}

func host(id string, hetero bool, current map[string]int) VGPUHost {
	return VGPUHost{ID: id, Model: "H100", Types: h100Types(), Current: current, Heterogeneous: hetero, MemoryMiB: 81920}
}

func TestPlaceVGPU(t *testing.T) {
	for _, tc := range []struct {
		name   string
		hosts  []VGPUHost
		req    VGPURequest
		want   string
		reason string
	}{
		{
			name: "a GPU already running the type, fullest first",
			hosts: []VGPUHost{
				host("A", false, nil),
				host("B", false, map[string]int{"H100XM-20C": 1}),
				host("C", false, map[string]int{"H100XM-20C": 3}),
			},
			req:  VGPURequest{Type: "H100XM-20C"},
			want: "C", reason: "already runs 3 H100XM-20C",
		},
		{
			name: "a full GPU of the type is skipped",
			hosts: []VGPUHost{
				host("A", false, map[string]int{"H100XM-20C": 4}),
				host("B", false, nil),
			},
			req:  VGPURequest{Type: "H100XM-20C"},
			want: "B", reason: "locks to H100XM-20C",
		},
		{
			name: "a homogeneous GPU locked to another type is skipped",
			hosts: []VGPUHost{
				host("A", false, map[string]int{"H100XM-40C": 1}),
				host("B", false, nil),
			},
			req:  VGPURequest{Type: "H100XM-20C"},
			want: "B",
		},
		{
			name: "a heterogeneous GPU in use before an empty one",
			hosts: []VGPUHost{
				host("A", false, nil),
				host("B", true, map[string]int{"H100XM-40C": 1}),
			},
			req:  VGPURequest{Type: "H100XM-20C"},
			want: "B", reason: "heterogeneous, 50% of its framebuffer in use",
		},
		{
			name: "wanted 40C: lock the empty GPU whose loss costs least room",
			hosts: []VGPUHost{
				host("A", false, nil), // locking it to 20C removes room for two 40C
				host("B", true, nil),  // a 20C here leaves room for one 40C
			},
			req:  VGPURequest{Type: "H100XM-20C", Wanted: map[string]int{"H100XM-40C": 2}},
			want: "B",
		},
		{
			name: "wanted 80C: keep a whole GPU free",
			hosts: []VGPUHost{
				host("A", true, nil),
				host("B", false, nil),
				host("C", false, map[string]int{"H100XM-80C": 1}),
			},
			// Either empty GPU loses its 80C room; wanted 80C x1 stays
			// creatable either way, so the fleet order decides.
			req:  VGPURequest{Type: "H100XM-8C", Wanted: map[string]int{"H100XM-80C": 1}},
			want: "A", reason: "wanted vGPUs left without room: 0 MiB",
		},
		{
			name: "wanted types decide between empty GPUs",
			hosts: []VGPUHost{
				host("A", false, nil),
				host("B", true, map[string]int{"H100XM-40C": 2}), // full
				host("C", true, nil),
			},
			// On A (homogeneous) an 8C locks out both wanted 20C; on C
			// (heterogeneous) it leaves room for three.
			req:  VGPURequest{Type: "H100XM-8C", Wanted: map[string]int{"H100XM-20C": 4}},
			want: "C", reason: "heterogeneous, stays open to other types",
		},
		{
			name: "GPU constraint",
			hosts: []VGPUHost{
				host("A", false, map[string]int{"H100XM-20C": 3}),
				host("B", false, nil),
			},
			req:  VGPURequest{Type: "H100XM-20C", GPU: "B"},
			want: "B",
		},
		{
			name: "unavailable host is skipped",
			hosts: func() []VGPUHost {
				a := host("A", false, map[string]int{"H100XM-20C": 3})
				a.Unavailable = true
				return []VGPUHost{a, host("B", false, nil)}
			}(),
			req:  VGPURequest{Type: "H100XM-20C"},
			want: "B",
		},
		{
			name: "spread by tenant",
			hosts: func() []VGPUHost {
				a := host("A", false, map[string]int{"H100XM-20C": 2})
				a.Tenants = map[string]int{"acme": 2}
				b := host("B", false, map[string]int{"H100XM-20C": 1})
				b.Tenants = map[string]int{"other": 1}
				return []VGPUHost{a, b}
			}(),
			req:  VGPURequest{Type: "H100XM-20C", Tenant: "acme", Affinity: AffinitySpread},
			want: "B", reason: "spread: tenant acme has 0 here",
		},
		{
			name: "mixed maximum in heterogeneous mode",
			hosts: []VGPUHost{
				host("A", true, map[string]int{"H100XM-8C": 8}),  // mixed max 8 reached, 16 GiB left
				host("B", false, map[string]int{"H100XM-8C": 8}), // homogeneous max 10
			},
			req:  VGPURequest{Type: "H100XM-8C"},
			want: "B",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := PlaceVGPU(tc.hosts, tc.req)
			if err != nil {
				t.Fatalf("PlaceVGPU: %v", err)
			}
			if d.GPU != tc.want {
				t.Fatalf("PlaceVGPU = %s, want %s (%s)", d.GPU, tc.want, d.Reason)
			}
			if !strings.Contains(d.Reason, tc.reason) {
				t.Errorf("reason %q does not contain %q", d.Reason, tc.reason)
			}
		})
	}
}

func TestPlaceVGPUErrors(t *testing.T) {
	full := []VGPUHost{host("A", false, map[string]int{"H100XM-40C": 2}), host("B", true, map[string]int{"H100XM-80C": 1})}
	for _, tc := range []struct {
		name     string
		hosts    []VGPUHost
		req      VGPURequest
		is       error
		contains string
	}{
		{"unknown type", full, VGPURequest{Type: "L4-24Q"}, ErrUnknownProfile, "L4-24Q"},
		{"no such GPU", full, VGPURequest{Type: "H100XM-20C", GPU: "Z"}, ErrNoSuchGPU, "Z"},
		{"no room", full, VGPURequest{Type: "H100XM-20C"}, ErrNoCapacity, "creatable now: nothing"},
		{"type filtered out by model", full, VGPURequest{Type: "H100XM-20C", Models: []string{"L4"}}, ErrUnknownProfile, "no GPU of model L4 on this host offers it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := PlaceVGPU(tc.hosts, tc.req)
			if !errors.Is(err, tc.is) {
				t.Fatalf("error %v, want %v", err, tc.is)
			}
			if !strings.Contains(err.Error(), tc.contains) {
				t.Fatalf("error %q does not contain %q", err, tc.contains)
			}
		})
	}
}

func TestVGPUTypes(t *testing.T) {
	c := loadCatalog(t)
	m, ok := c.Model("H100-SXM5-80GB")
	if !ok {
		t.Fatal("catalog has no H100-SXM5-80GB")
	}
	types := VGPUTypes(m)
	if got, want := types["H100XM-8C"], (VGPUTypeCap{Max: 10, MaxMixed: 8, FramebufferMiB: 8192}); !reflect.DeepEqual(got, want) {
		t.Errorf("H100XM-8C = %+v, want %+v", got, want)
	}
	if _, ok := types["H100XM-3-40C"]; ok {
		t.Error("MIG-backed type listed as time-sliced")
	}
	if VGPUTypes(nil) != nil {
		t.Error("VGPUTypes(nil) is not nil")
	}
}
