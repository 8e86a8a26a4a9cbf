package sysfs

import (
	"errors"
	"strings"
	"testing"
)

func TestParseCreatable(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want []CreatableType
		err  string
	}{
		{"header only", "ID    : vGPU Name\n", nil, ""},
		{"types", "ID    : vGPU Name\n1145  : NVIDIA L40S-1B\n1146  : NVIDIA L40S-2B\n", []CreatableType{{1145, "NVIDIA L40S-1B"}, {1146, "NVIDIA L40S-2B"}}, ""},
		{"five-digit id", "ID    : vGPU Name\n10001 : NVIDIA X-1Q\n", []CreatableType{{10001, "NVIDIA X-1Q"}}, ""},
		{"no trailing newline", "ID    : vGPU Name\n594   : NVIDIA A10-6Q", []CreatableType{{594, "NVIDIA A10-6Q"}}, ""},
		{"empty", "", nil, "missing header"},
		{"no header", "1145  : NVIDIA L40S-1B\n", nil, "missing header"},
		{"no colon", "ID    : vGPU Name\n1145 NVIDIA\n", nil, "no ':'"},
		{"bad id", "ID    : vGPU Name\nabc   : NVIDIA L40S-1B\n", nil, "not a positive integer"},
		{"zero id", "ID    : vGPU Name\n0     : NVIDIA L40S-1B\n", nil, "not a positive integer"},
		{"empty name", "ID    : vGPU Name\n1145  :   \n", nil, "empty type name"},
		{"too long", "ID    : vGPU Name\n" + strings.Repeat("1 : a\n", 1000), nil, "more than a page"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseCreatable([]byte(c.in))
			if c.err != "" {
				if !errors.Is(err, ErrParse) || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want ErrParse with %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("got %v, want %v", got, c.want)
				}
			}
		})
	}
}

func TestParseDescription(t *testing.T) {
	d, err := ParseDescription([]byte("num_heads=4, frl_config=60, framebuffer=1024M, max_resolution=5120x2880, max_instance=24\n"))
	if err != nil {
		t.Fatal(err)
	}
	if d != (Description{NumHeads: 4, FrameRateLimit: 60, FramebufferMiB: 1024, MaxResolution: "5120x2880", MaxInstance: 24}) {
		t.Fatalf("got %+v", d)
	}
	d, err = ParseDescription([]byte("num_heads=1, frl_config=60, framebuffer=4096M, max_resolution=4096x2160, max_instance=6, new_key=x"))
	if err != nil || d.Unknown != "new_key=x" {
		t.Fatalf("unknown key: %+v, %v", d, err)
	}
	for _, bad := range []string{"", "num_heads", "num_heads=-1", "framebuffer=1024", "framebuffer=xM", "max_resolution=big",
		"num_heads=1, num_heads=2", "=3", "max_instance=1e3"} {
		if _, err := ParseDescription([]byte(bad)); !errors.Is(err, ErrParse) {
			t.Errorf("%q: err = %v, want ErrParse", bad, err)
		}
	}
}

func FuzzParseCreatable(f *testing.F) {
	for _, s := range []string{"ID    : vGPU Name\n", "ID    : vGPU Name\n1145  : NVIDIA L40S-1B\n", "", ":\n:", "ID:vGPU Name\n1:x\n-1:y"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		types, err := ParseCreatable(data)
		if err != nil {
			if !errors.Is(err, ErrParse) {
				t.Fatalf("error %v does not wrap ErrParse", err)
			}
			return
		}
		for _, c := range types {
			if c.ID <= 0 || c.Name == "" {
				t.Fatalf("accepted bad entry %+v", c)
			}
		}
	})
}

func FuzzParseDescription(f *testing.F) {
	for _, s := range []string{"num_heads=4, frl_config=60, framebuffer=1024M, max_resolution=5120x2880, max_instance=24\n", "", "a=b", "framebuffer=99999999999M"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := ParseDescription(data); err != nil && !errors.Is(err, ErrParse) {
			t.Fatalf("error %v does not wrap ErrParse", err)
		}
	})
}
