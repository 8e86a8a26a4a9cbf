package manager

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
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

// Compute-instance profile names have several spellings that name one
// profile: nvidia-smi's "1c.3g.40gb", the same with leading zeros
// ("01c.3g.40gb"), and for the compute instance that covers its whole GPU
// instance "3c.3g.40gb" beside the GPU-instance profile's own "3g.40gb".
// Records and comparisons use one: nvidia-smi's (profile.ComputeInstanceName),
// with whatever model qualifier the caller gave ("H100-SXM5-80GB/",
// "H100-") kept. Create stores that spelling, and reconcile rewrites
// records an older vgpud stored as typed (canonicalRecords).

// splitComputeInstanceName finds a compute-instance spelling in a profile
// name as create takes it: the qualifier before it ("", "MODEL/" or the
// "H100-" of a model-name prefix), its compute slices and its GPU-instance
// profile. ok is false when the name has none.
func splitComputeInstanceName(raw string) (qual string, slices int, gi string, ok bool) {
	rest := raw
	if mod, r, found := strings.Cut(raw, "/"); found {
		qual, rest = mod+"/", r
	}
	if n, g, found := profile.ParseComputeInstanceName(strings.TrimPrefix(rest, "MIG ")); found {
		return qual, n, g, true
	}
	// "H100-1c.3g.40gb": a model-name prefix before it.
	if i := strings.Index(rest, "-"); i > 0 {
		if n, g, found := profile.ParseComputeInstanceName(rest[i+1:]); found {
			return qual + rest[:i+1], n, g, true
		}
	}
	return "", 0, "", false
}

// canonicalProfile is the spelling create records for raw, whose offers
// are offers: raw itself unless it spells a compute instance and every
// offer names the same MIG profile.
func canonicalProfile(raw string, offers []offer) string {
	qual, _, _, ok := splitComputeInstanceName(raw)
	if !ok || len(offers) == 0 {
		return raw
	}
	name := ""
	for i, o := range offers {
		if o.kind != store.KindMIG || (i > 0 && o.name() != name) {
			return raw
		}
		name = o.name()
	}
	return qual + name
}

// canonicalRecordProfile is the spelling of r's profile that create
// records now: r's own unless it spells a compute instance otherwise. The
// record's carve says which compute instance it is: one of CISlices
// slices, or the whole GPU instance when CISlices is 0.
func canonicalRecordProfile(r store.Instance) string {
	qual, n, gi, ok := splitComputeInstanceName(r.Profile)
	if !ok || r.Kind != store.KindMIG {
		return r.Profile
	}
	if r.CISlices == 0 {
		return qual + gi
	}
	if r.CISlices != n {
		return r.Profile // not what the name says: leave it for an operator to see
	}
	return qual + strconv.Itoa(n) + "c." + gi
}

// canonicalRecords rewrites the records whose profile an older vgpud
// stored as typed ("01c.3g.40gb", "3c.3g.40gb") to the spelling create
// records now, so that every comparison, view and metric sees one name
// per profile. Nothing else of the record changes.
func (m *Manager) canonicalRecords() error {
	// Read first: reconcile runs often, and a write transaction for
	// nothing would cost every pass a commit.
	stale := false
	err := m.db.View(func(tx *store.Tx) error {
		recs, err := tx.Instances()
		for _, r := range recs {
			stale = stale || canonicalRecordProfile(r) != r.Profile
		}
		return err
	})
	if err != nil || !stale {
		return classify(err, "read instances")
	}
	err = m.db.Update(func(tx *store.Tx) error {
		recs, err := tx.Instances()
		if err != nil {
			return err
		}
		for i := range recs {
			r := &recs[i]
			canon := canonicalRecordProfile(*r)
			if canon == r.Profile {
				continue
			}
			m.log.Info("profile name made canonical", "instance", r.UUID, "was", r.Profile, "now", canon)
			r.Profile = canon
			if err := tx.PutInstance(r); err != nil {
				return err
			}
		}
		return nil
	})
	return classify(err, "rewrite profile names")
}
