// Package testenv holds what the project's tests and benchmark programs
// share about their surroundings; its subpackages start real services
// (libvirtd, dbus-daemon) for tests, or build the manager on a simulated
// host (simhost). Only tests and bench/ import it.
//
// Imports: nothing from vgpud.
package testenv

import (
	"errors"
	"os"
	"path/filepath"
)

// RepoRoot finds the repository root (the directory holding go.mod) from
// the working directory up.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
