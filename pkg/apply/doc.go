// Package apply is vgpud's declarative configuration engine: it reads a
// file describing the desired layout of the host (vgpud's own versioned
// format, or the mig-configs of NVIDIA mig-parted, or the vgpu-configs of
// NVIDIA vgpu-device-manager), computes the smallest set of changes that
// takes the host there (Diff), and performs it through the manager's own
// operations in a safe order (Execute). docs/apply.md describes the formats.
//
// It owns no state: everything it knows of the host comes through the
// Manager interface, which *manager.Manager satisfies. The D-Bus layer
// imports it (vgpuctl sends files to the daemon over D-Bus).
//
// Imports: pkg/gpu, pkg/manager, pkg/profile, pkg/store, pkg/tenant.
package apply
