// Package profiles embeds the built-in GPU catalog (one YAML file per GPU
// model). pkg/profile parses and validates it; /etc/vgpud/profiles.d
// overrides it on a host.
//
// Imports: nothing from vgpud.
package profiles

import "embed"

// FS holds every catalog file.
//
//go:embed *.yaml
var FS embed.FS
