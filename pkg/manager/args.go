package manager

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxVMRef bounds a VM reference ("name" or "URI/name"): libvirt's own
// names are short, and a longer one is a mistake or an attack, never a VM.
const maxVMRef = 1024

// QuoteArg quotes a caller's string for a message, cut to its first 64
// bytes: a refusal names what it refused without echoing a megabyte.
func QuoteArg(s string) string {
	const keep = 64
	if len(s) <= keep {
		return strconv.Quote(s)
	}
	cut := keep
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "… (" + strconv.Itoa(len(s)) + " bytes)"
}

// checkVMRef refuses VM references that cannot name a libvirt domain,
// before libvirt is asked: empty, surrounded by spaces, too long, not
// UTF-8, or with control characters (libvirt refuses a newline in a name,
// and none belongs in a log line). XML metacharacters are allowed: libvirt
// allows them in names, and every document vgpud sends is written by
// libvirtxml, which escapes them.
func checkVMRef(ref string) error {
	why := ""
	switch {
	case ref == "":
		why = "is empty"
	case strings.TrimSpace(ref) != ref:
		why = "has surrounding spaces"
	case len(ref) > maxVMRef:
		why = "is longer than " + strconv.Itoa(maxVMRef) + " bytes"
	case !utf8.ValidString(ref):
		why = "is not UTF-8"
	case strings.IndexFunc(ref, unicode.IsControl) >= 0:
		why = "has control characters"
	}
	if why == "" {
		return nil
	}
	return fail(ErrInvalidArgument, nil, "VM %s %s; give a libvirt domain name (virsh list --all)", QuoteArg(ref), why)
}
