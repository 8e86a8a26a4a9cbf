package profile_test

import (
	"bytes"
	"errors"
	"io/fs"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

// FuzzParse: Parse never panics; it returns either a model that validates
// and survives a YAML round trip unchanged, or an error wrapping ErrInvalid.
// Seeds: every embedded catalog file, truncations of them, and broken files;
// testdata/fuzz/FuzzParse holds more.
func FuzzParse(f *testing.F) {
	files, err := fs.Glob(profiles.FS, "*.yaml")
	if err != nil || len(files) == 0 {
		f.Fatalf("embedded catalog: %v files, %v", len(files), err)
	}
	for _, name := range files {
		data, err := fs.ReadFile(profiles.FS, name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
		f.Add(data[:len(data)/2])
		f.Add(bytes.Replace(data, []byte("placements: [0"), []byte("placements: [-1"), 1))
	}
	for _, s := range []string{
		"",
		"null",
		"version: v1\n",
		"version: v1\nname: X\nmig: {memorySlices: 4}\n",
		"version: v1\nname: X\nmig: {memorySlices: 100000000000000000000}\n",
		"version: v1\nname: X\nvgpu: {types: [{gpuInstanceProfile: 0}]}\n",
		"version: v1\nname: X\nmemoryMiB: 18446744073709551615\nvgpu: {flows: [mdev], types: [{id: 1, name: X-1C, series: C, framebufferMiB: 1, maxInstances: 9223372036854775807}]}\n",
		"version: v1\nname: X\nmig: {memorySlices: 8, computeSlices: 7, gpuInstanceProfiles: [{size: 9223372036854775807, placements: [9223372036854775807]}]}\n",
		"a: &a [*a, *a]\n",
		"- - - - - - - - - -\n",
		"name: [\n",
		"\tversion: v1\n",
		"version: v1\nversion: v2\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := profile.Parse("fuzz.yaml", data)
		if err != nil {
			if !errors.Is(err, profile.ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			if m != nil {
				t.Fatalf("model returned with error %v", err)
			}
			return
		}
		if m == nil {
			t.Fatal("no model and no error")
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("Parse accepted a model that does not validate: %v", err)
		}
		out, err := yaml.Marshal(m)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		again, err := profile.Parse("roundtrip.yaml", out)
		if err != nil {
			t.Fatalf("round trip rejected: %v\n%s", err, out)
		}
		out2, err := yaml.Marshal(again)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		if !bytes.Equal(out, out2) {
			t.Fatalf("round trip changed the model:\n%s\n---\n%s", out, out2)
		}
	})
}
