package placement

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/vgpud/vgpud/pkg/store"
)

// The classes every vgpud host shares, as pkg/fleet names them
// (fleet.SliceClass, fleet.FramebufferClass, fleet.GPUClass and its total
// fleet.GPUUnits; TestFlavorsMatchFleetDoc checks they agree).
const (
	SliceClass       = "CUSTOM_VGPUD_MIG_SLICE"
	FramebufferClass = "CUSTOM_VGPUD_VGPU_FB_MIB"
	GPUClass         = "CUSTOM_VGPUD_GPU"
	GPUUnits         = 64
)

// ClassNamer names a profile's resource class: pkg/fleet's ClassName,
// which the callers pass in because pkg/fleet's own tests import this
// package.
type ClassNamer func(kind store.InstanceKind, profile string) string

// ProfileFlavor is one profile as a fleet scheduler asks Placement for
// it, the way docs/fleet.md tells a Nova flavor to ("Asking for a
// profile"): its class and, in the same numbered group, its share of the
// GPU class (a whole GPU all of it, the rest one unit), and the MIG slices
// it takes or, for a time-sliced type, its framebuffer.
type ProfileFlavor struct {
	Profile string
	Kind    store.InstanceKind
	// Slices is what it takes of the slice class: a MIG profile's slots,
	// or those of the GPU instance a MIG-backed type has alone; 0 for a
	// type that shares its GPU instance and for the rest.
	Slices int
	// FramebufferMiB is a time-sliced type's framebuffer, 0 for the rest.
	FramebufferMiB int
	// GPU is what it takes of GPUClass: GPUUnits for a whole GPU, 1 for
	// the rest.
	GPU int
}

// ProfileFlavors are the profiles the fleet tests, bench/fleet and docs/fleet.md
// ask Placement for: the one table of what each takes.
var ProfileFlavors = []ProfileFlavor{
	{Profile: "1g.10gb", Kind: store.KindMIG, Slices: 1, GPU: 1},
	{Profile: "2g.20gb", Kind: store.KindMIG, Slices: 2, GPU: 1},
	{Profile: "3g.40gb", Kind: store.KindMIG, Slices: 4, GPU: 1},
	{Profile: "L4-4Q", Kind: store.KindVGPU, FramebufferMiB: 4096, GPU: 1},
	{Profile: "H100XM-8C", Kind: store.KindVGPU, FramebufferMiB: 8192, GPU: 1},
	{Profile: "H100XM-2-20C", Kind: store.KindMIGVGPU, Slices: 2, GPU: 1},
	{Profile: "H100XM-3-40C", Kind: store.KindMIGVGPU, Slices: 4, GPU: 1},
	{Profile: "RTX Pro 6000 Blackwell DC-1-6Q", Kind: store.KindMIGVGPU, GPU: 1},
	{Profile: "passthrough", Kind: store.KindPassthrough, GPU: GPUUnits},
}

// ChurnProfiles are the profiles the churn tests and bench/fleet schedule:
// every flow on the hosts they build.
var ChurnProfiles = []string{"1g.10gb", "2g.20gb", "3g.40gb", "L4-4Q", "H100XM-8C", "H100XM-2-20C", "passthrough"}

// Form is how a flavor asks for a time-sliced type.
type Form int

const (
	// WithFramebuffer asks a time-sliced type's framebuffer beside its
	// class, so that Placement itself refuses what does not fit.
	WithFramebuffer Form = iota
	// ClassAlone asks a time-sliced type's class alone: vgpud adds the
	// framebuffer when the create adopts the allocation.
	ClassAlone
)

// FlavorOf is the table's flavor of profile; it panics on a profile the
// table lacks (a test's mistake).
func FlavorOf(profile string) ProfileFlavor {
	for _, f := range ProfileFlavors {
		if f.Profile == profile {
			return f
		}
	}
	panic(fmt.Sprintf("placement.FlavorOf: no flavor for %q: add it to ProfileFlavors", profile))
}

// amounts are the classes f asks for, its own class first.
func (f ProfileFlavor) amounts(class ClassNamer, form Form) [][2]string {
	out := [][2]string{{class(f.Kind, f.Profile), "1"}}
	if f.GPU > 0 {
		out = append(out, [2]string{GPUClass, strconv.Itoa(f.GPU)})
	}
	if f.Slices > 0 {
		out = append(out, [2]string{SliceClass, strconv.Itoa(f.Slices)})
	}
	if f.FramebufferMiB > 0 && form == WithFramebuffer {
		out = append(out, [2]string{FramebufferClass, strconv.Itoa(f.FramebufferMiB)})
	}
	return out
}

// Request is f as a Scheduler asks for it (one granular group).
func (f ProfileFlavor) Request(class ClassNamer, form Form) Request {
	var parts []string
	for _, a := range f.amounts(class, form) {
		parts = append(parts, a[0]+":"+a[1])
	}
	return Request{Profile: f.Profile, Resources: strings.Join(parts, ",")}
}

// ExtraSpecs are f as a Nova flavor's extra specs (Flavor.ExtraSpecs), in
// numbered group 1.
func (f ProfileFlavor) ExtraSpecs(class ClassNamer, form Form) map[string]string {
	m := map[string]string{}
	for _, a := range f.amounts(class, form) {
		m["resources1:"+a[0]] = a[1]
	}
	return m
}

// Requests are the Requests of profiles, in their order.
func Requests(class ClassNamer, form Form, profiles ...string) []Request {
	out := make([]Request, 0, len(profiles))
	for _, p := range profiles {
		out = append(out, FlavorOf(p).Request(class, form))
	}
	return out
}
