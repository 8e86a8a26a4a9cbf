package dbusapi

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/godbus/dbus/v5"

	"github.com/vgpud/vgpud/pkg/manager"
)

// Bounds on what a caller may send. Every string a method takes is checked
// against them before the method runs, so a megabyte argument is refused
// with a short message instead of being echoed into replies and logs.
const (
	// maxName bounds names: tenants, profiles, VMs, selections, option values.
	maxName = 255
	// maxID bounds identifiers: instance UUIDs, GPU ids, operation ids.
	maxID = 128
	// maxDocument bounds a configuration document (Apply's data), as the
	// apply parser does.
	maxDocument = 4 << 20
	// maxListLen bounds the entries of a list option (allowed-models).
	maxListLen = 256
)

// limit is the longest string an argument may be.
func (a arg) limit() int {
	if a.max > 0 {
		return a.max
	}
	return maxName
}

// checkArgs checks the decoded arguments of one call against their
// bounds: strings within their limit, UTF-8, without control characters
// and without surrounding spaces (a document may have all of line breaks,
// tabs and blank lines); option values likewise. A name with a space
// around it is a quoting mistake, never a different name.
func checkArgs(member string, def *methodDef, vals []any) error {
	for i, v := range vals {
		a := def.in[i]
		switch x := v.(type) {
		case string:
			if err := checkString(member, "argument "+a.name, x, a.limit(), a.max == maxDocument); err != nil {
				return err
			}
		case map[string]dbus.Variant:
			for k, ov := range x {
				if err := checkString(member, "option name", k, maxName, false); err != nil {
					return err
				}
				if err := checkOption(member, k, ov.Value()); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func checkOption(member, key string, v any) error {
	what := "option " + manager.QuoteArg(key)
	switch x := v.(type) {
	case string:
		return checkString(member, what, x, maxName, false)
	case []string:
		if len(x) > maxListLen {
			return invalidArg("%s: %s has %d entries; at most %d", member, what, len(x), maxListLen)
		}
		for _, s := range x {
			if err := checkString(member, what, s, maxName, false); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkString(member, what, s string, limit int, document bool) error {
	why := ""
	switch {
	case len(s) > limit:
		why = fmt.Sprintf("is %d bytes; at most %d", len(s), limit)
	case !utf8.ValidString(s):
		why = "is not UTF-8"
	case strings.IndexFunc(s, func(r rune) bool {
		return unicode.IsControl(r) && !(document && (r == '\n' || r == '\r' || r == '\t'))
	}) >= 0:
		why = "has control characters"
	case !document && strings.TrimSpace(s) != s:
		why = "has surrounding spaces"
	}
	if why == "" {
		return nil
	}
	return invalidArg("%s: %s %s %s", member, what, manager.QuoteArg(s), why)
}
