package profile_test

import (
	"testing"

	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

func TestEmbeddedCatalogIsValid(t *testing.T) {
	c, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Models()) == 0 {
		t.Fatal("no models")
	}
}
