// Package conventions holds the tests that keep the tree's conventions:
// every package states in its doc comment which of the module's packages it
// may import, in a line
//
//	Imports: pkg/gpu, pkg/profile.
//
// ("nothing from vgpud." when none; a path ending in /... allows the
// subtree), and its imports keep to it and to its floor, the layering
// declared once in layers_test.go; os/exec is imported only by test
// harnesses; docs/architecture.md names every package and every file of
// cmd/vgpud, and only paths that exist; a comment cites only documents
// (and headings) that exist. It has no code of its own.
//
// Imports: nothing from vgpud.
package conventions
