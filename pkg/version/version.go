// Package version holds the build's version string, set by the linker
// (make build) and printed by vgpud --version and vgpuctl --version.
//
// Imports: nothing from vgpud.
package version

// Version is overwritten at link time with -X.
var Version = "dev"
