package config

import (
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"time"
)

// Duration is a time.Duration written as "30s" in YAML.
type Duration struct{ time.Duration }

// UnmarshalJSON reads "30s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w", s, err)
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes "30s".
func (d Duration) MarshalJSON() ([]byte, error) { return []byte(`"` + d.String() + `"`), nil }

// SocketMode is a Unix socket's permission bits, written as an octal
// string ("0660") in the file and on the command line.
type SocketMode struct{ mode fs.FileMode }

// FileMode is the mode (0660 when unset).
func (m SocketMode) FileMode() fs.FileMode {
	if m.mode == 0 {
		return defaultSocketMode
	}
	return m.mode
}

// defaultSocketMode: the owner (root) and the socket's group.
const defaultSocketMode fs.FileMode = 0o660

func parseSocketMode(s string) (SocketMode, error) {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v == 0 || v > 0o777 || !strings.HasPrefix(s, "0") {
		return SocketMode{}, fmt.Errorf("%q is not a mode: write permission bits in octal with a leading 0, quoted in YAML (\"0660\")", s)
	}
	// Connecting needs write permission: a mode without any w bit is
	// no endpoint at all.
	if v&0o222 == 0 {
		return SocketMode{}, fmt.Errorf("%q lets no one connect (connecting to a socket needs its w bit)", s)
	}
	return SocketMode{fs.FileMode(v)}, nil
}

// String is the mode as written ("0660").
func (m SocketMode) String() string { return fmt.Sprintf("%#o", uint32(m.FileMode())) }

// Set parses a flag value.
func (m *SocketMode) Set(s string) error {
	v, err := parseSocketMode(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// Type names the flag's value.
func (m *SocketMode) Type() string { return "mode" }

// UnmarshalJSON reads "0660" (a string: YAML reads an unquoted 0660 as
// the number 432, and 660 as six hundred and sixty).
func (m *SocketMode) UnmarshalJSON(b []byte) error {
	s, err := strconv.Unquote(string(b))
	if err != nil {
		return fmt.Errorf("%s is not a mode: write it quoted, in octal (\"0660\")", b)
	}
	return m.Set(s)
}

// MarshalJSON writes "0660".
func (m SocketMode) MarshalJSON() ([]byte, error) { return []byte(strconv.Quote(m.String())), nil }
