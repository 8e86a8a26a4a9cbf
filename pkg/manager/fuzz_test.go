package manager_test

import (
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// FuzzManagerOperations drives the manager on the simulated host with a
// sequence of operations, valid and hostile alike (empty, whitespace,
// unknown and malformed tenants, profiles, GPUs, VMs, instance ids), and
// after every step checks what the crash test checks after a restart: no
// intent left, every record ready, the store and the host agreeing both
// ways (discovered through NVML and sysfs), attachments and the VMs'
// configs agreeing both ways, each tenant's usage the catalog's sum over
// its instances. It also checks that each step changed only what its
// operation may change, whether it succeeded or not: a refused operation
// changes nothing (a forced undefine may have destroyed some of its own
// tenant's instances), and no operation touches another tenant's
// instances, or, for apply, GPUs its document does not describe. Every
// refusal wraps one of the manager's sentinels, and none is a backend
// failure: nothing fails on the simulated host.
//
// The input is a program of up to fuzzMaxOps operations of 4 bytes each
// (fuzzOp). The seeds run with `go test`; `make fuzz` explores further.
func FuzzManagerOperations(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s.program())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := newFuzzRun(t)
		for i, o := range decodeFuzzProgram(data) {
			r.step(i, o)
		}
	})
}

// fuzzMaxOps bounds one execution (each step also discovers the host).
const fuzzMaxOps = 16

// The operations, by the first byte of a fuzzOp (modulo their number).
const (
	fuzzDefine byte = iota
	fuzzUndefine
	fuzzCreate
	fuzzDestroy
	fuzzAttach
	fuzzDetach
	fuzzDefragment
	fuzzApply
	fuzzCreateAttach
	fuzzCreateUUID
	fuzzMdevctl
	fuzzOpCount
)

// fuzzOp is one operation; a, b and c pick its arguments from the tables
// below (modulo their length), as step says for each operation.
type fuzzOp struct{ code, a, b, c byte }

func decodeFuzzProgram(data []byte) []fuzzOp {
	var ops []fuzzOp
	for len(data) >= 4 && len(ops) < fuzzMaxOps {
		ops = append(ops, fuzzOp{data[0] % fuzzOpCount, data[1], data[2], data[3]})
		data = data[4:]
	}
	return ops
}

// The argument tables (fuzzSeeds names the entries it uses).
var (
	fuzzTenants  = []string{"alpha", "beta", "gamma", "", " ", "alpha ", "ALPHA", "a_b", strings.Repeat("a", 300), "-"}
	fuzzProfiles = []string{"1g.10gb", "2g.20gb", "3g.40gb", "H100XM-1-10C", "H100XM-10C", "L4-2Q", "A10-2Q", "passthrough",
		"", " ", "1g.10gb ", "9g.900gb", "L4-24GB/passthrough", "NVIDIA A10-8Q", "1c.3g.40gb", "2c.3g.40gb", "4c.3g.40gb"}
	fuzzGPUs = []string{"", sim.DefaultH100MIG, sim.DefaultH100TS, sim.DefaultL4, sim.DefaultA10, "0", "3", "9", " ", "0000:ff:00.0", "GPU-00000000-0000-0000-0000-000000000000"}
	fuzzVMs  = []string{"vm1", "vm2", "", " ", "nosuch", "qemu:///system/vm1", "qemu:///elsewhere/vm1", "vm1\n", "VM1"}
)

// fuzzUnknownID is an instance UUID no instance has.
const fuzzUnknownID = "00000000-0000-4000-8000-00000000f00d"

// fuzzForeignMdev is the UUID of an mdev vgpud did not create: mdevctl
// defines it (start auto) on the A10's first mdev parent, where it runs
// from the start of every execution. It must stay there, and no create
// may take it.
const fuzzForeignMdev = "6f1d3b8c-0a52-4d6e-9b1a-3c2f5e7d9f00"

// fuzzUUIDs are the instance UUIDs fuzzCreateUUID asks for: the foreign
// mdev's in two cases, the nil UUID in two spellings (refused, by name),
// and two that are free (the second time, a retry of the first create).
var fuzzUUIDs = []string{fuzzForeignMdev, strings.ToUpper(fuzzForeignMdev), "00000000-0000-0000-0000-000000000000",
	"urn:uuid:00000000-0000-0000-0000-000000000000", "6f1d3b8c-0a52-4d6e-9b1a-3c2f5e7d9f01", "6f1d3b8c-0a52-4d6e-9b1a-3c2f5e7d9f02"}

// fuzzMdevctlNames are the names fuzzMdevctl gives its entries in mdevctl's
// directory: the foreign mdev's definition (replaced), and a UUID nothing has.
var fuzzMdevctlNames = []string{fuzzForeignMdev, "6f1d3b8c-0a52-4d6e-9b1a-3c2f5e7d9f03"}

// fuzzDoc is an apply document with what it may touch: the GPUs it
// describes, and whether it prunes tenants it does not list.
type fuzzDoc struct {
	name, selectConfig, data string
	covers                   []string
	tenants                  []string
	prune                    bool
}

var fuzzDocs = []fuzzDoc{
	{name: "l4-a10", data: `version: v1
tenants:
  - {name: alpha, ensure: true}
  - {name: beta, ensure: true}
layout:
  - gpu: "0000:81:00.0"
    instances:
      - {profile: L4-2Q, tenant: alpha, count: 2}
  - gpu: "0000:a1:00.0"
    instances:
      - {profile: A10-2Q, tenant: beta, count: 1}
`, covers: []string{sim.DefaultL4, sim.DefaultA10}, tenants: []string{"alpha", "beta"}},
	{name: "prune-mig", data: `version: v1
prune: true
tenants:
  - {name: alpha, ensure: true}
layout:
  - gpu: "0000:41:00.0"
    mig: true
    instances:
      - {profile: 1g.10gb, tenant: alpha, count: 2}
`, covers: []string{sim.DefaultH100MIG}, tenants: []string{"alpha"}, prune: true},
	{name: "all-empty", data: `version: v1
layout:
  - all: true
    instances: []
`, covers: []string{sim.DefaultH100MIG, sim.DefaultH100TS, sim.DefaultL4, sim.DefaultA10}},
	{name: "empty-tenant", data: `version: v1
layout:
  - gpu: "0000:81:00.0"
    instances:
      - {profile: L4-2Q, tenant: "", count: 1}
`, covers: []string{sim.DefaultL4}},
	{name: "mig-parted", selectConfig: "gpu0-3g.40gb@beta", data: `version: v1
mig-configs:
  gpu0-3g.40gb:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "3g.40gb": 2
`, covers: []string{sim.DefaultH100MIG}, tenants: []string{"beta"}},
	{name: "mig-parted-no-tenant", selectConfig: "gpu0-3g.40gb@", data: `version: v1
mig-configs:
  gpu0-3g.40gb:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "3g.40gb": 2
`, covers: []string{sim.DefaultH100MIG}},
	{name: "unknown-gpu", data: `version: v1
layout:
  - gpu: "0000:ff:00.0"
    instances:
      - {profile: L4-2Q, tenant: alpha, count: 1}
`},
	{name: "unnamed-tenant", data: `version: v1
prune: true
tenants:
  - {name: ""}
`, prune: true},
}

// A seed is a named program.
type fuzzSeed struct {
	name string
	ops  []fuzzOp
}

func (s fuzzSeed) program() []byte {
	var b []byte
	for _, o := range s.ops {
		b = append(b, o.code, o.a, o.b, o.c)
	}
	return b
}

// fuzzSeeds run with `go test` in this order (seed#0, seed#1, ...).
func fuzzSeeds() []fuzzSeed {
	// Entries of the argument tables and documents the seeds use.
	const (
		tAlpha, tBeta, tGamma, tEmpty, tSpace, tTrailing, tUpper    = 0, 1, 2, 3, 4, 5, 6
		pMIG1, pMIG3, pMIGVGPU, pL4, pA10, pEmpty, pSpace, pUnknown = 0, 2, 3, 5, 6, 8, 9, 11
		pCI1, pCI2, pCIWide                                         = 14, 15, 16
		gAny, gMIG, gUnknown                                        = 0, 1, 9
		vm1, vm2, vmEmpty, vmURI                                    = 0, 1, 2, 5
		iEmpty, iSpace, iUnknown, iMalformed, iUpper, iSpaced       = 0x80, 0x81, 0x82, 0x83, 0x84, 0x85
		docL4A10, docPruneMIG, docAllEmpty, docEmptyTenant          = 0, 1, 2, 3
		uForeign, uForeignUpper, uNil, uNilURN, uFree               = 0, 1, 2, 3, 4
		mFIFO, mZeroLink, mFIFOLink, mDevice, mDir, mHuge           = 0, 1, 2, 3, 4, 5
		nForeign, nOther                                            = 0, 1
	)
	// iNth refers to the nth existing instance.
	iNth := func(n int) byte { return byte(8 * n) }
	op := func(code, a, b, c byte) fuzzOp { return fuzzOp{code, a, b, c} }
	return []fuzzSeed{
		// Two tenants with an instance each; undefining the tenant named ""
		// by force must destroy nothing.
		{"undefine-empty-tenant-force", []fuzzOp{
			op(fuzzCreate, tAlpha, pL4, gAny), op(fuzzCreate, tBeta, pA10, gAny),
			op(fuzzUndefine, tEmpty, 0, 1),
			op(fuzzUndefine, tSpace, 0, 1), op(fuzzUndefine, tUpper, 0, 1), op(fuzzUndefine, tTrailing, 0, 1), op(fuzzUndefine, tGamma, 0, 1),
		}},
		// Compute instances share a tenant's GPU instance; a destroy in the
		// middle leaves a hole the next one fills.
		{"compute-instances", []fuzzOp{
			op(fuzzCreate, tAlpha, pCI1, gMIG), op(fuzzCreate, tAlpha, pCI1, gMIG), op(fuzzCreate, tBeta, pCI1, gMIG),
			op(fuzzCreate, tAlpha, pCI2, gMIG), op(fuzzCreate, tAlpha, pCIWide, gMIG), op(fuzzDestroy, iNth(0), 0, 0),
			op(fuzzCreate, tAlpha, pCI1, gMIG), op(fuzzCreate, tAlpha, pCI1, gMIG), op(fuzzCreate, tAlpha, pMIGVGPU, gAny),
			op(fuzzDestroy, iNth(1), 0, 0), op(fuzzDestroy, iNth(0), 0, 0),
		}},
		{"undefine-refused", []fuzzOp{
			op(fuzzCreate, tAlpha, pMIG1, gAny), op(fuzzCreate, tBeta, pMIG1, gAny),
			op(fuzzUndefine, tEmpty, 0, 0), op(fuzzUndefine, tAlpha, 0, 0), op(fuzzUndefine, tBeta, 0, 1), op(fuzzUndefine, tBeta, 0, 1),
		}},
		{"create-odd-arguments", []fuzzOp{
			op(fuzzCreate, tEmpty, pMIG1, gAny), op(fuzzCreate, tSpace, pMIG1, gAny), op(fuzzCreate, tTrailing, pMIG1, gAny),
			op(fuzzCreate, tAlpha, pEmpty, gAny), op(fuzzCreate, tAlpha, pSpace, gAny), op(fuzzCreate, tAlpha, pUnknown, gAny),
			op(fuzzCreate, tAlpha, 10, gAny), op(fuzzCreate, tAlpha, pMIG1, gUnknown), op(fuzzCreate, tAlpha, pMIG1, 8),
			op(fuzzCreate, tAlpha, pMIG1, gMIG), op(fuzzCreate, tGamma, pMIG1, gAny), op(fuzzCreate, tAlpha, 7, gAny),
		}},
		{"attach-detach", []fuzzOp{
			op(fuzzCreate, tAlpha, pMIGVGPU, gAny), op(fuzzAttach, iNth(0), vm1, 0), op(fuzzAttach, iNth(0), vm2, 0),
			op(fuzzAttach, iNth(0), vmEmpty, 0), op(fuzzDestroy, iNth(0), 0, 0), op(fuzzDetach, iNth(0), 0, 0), op(fuzzDetach, iNth(0), 0, 0),
			op(fuzzAttach, iNth(0), vmURI, 0), op(fuzzAttach, iNth(0), 6, 0), op(fuzzAttach, iNth(0), 7, 0), op(fuzzAttach, iNth(0), 8, 0),
			op(fuzzAttach, iEmpty, vm1, 0), op(fuzzDetach, iUnknown, 0, 0), op(fuzzDestroy, iNth(0), 1, 0),
		}},
		{"destroy-odd-ids", []fuzzOp{
			op(fuzzCreate, tAlpha, pL4, gAny), op(fuzzCreate, tBeta, pA10, gAny),
			op(fuzzDestroy, iEmpty, 0, 0), op(fuzzDestroy, iSpace, 1, 0), op(fuzzDestroy, iUnknown, 0, 0), op(fuzzDestroy, iMalformed, 0, 0),
			op(fuzzDestroy, iSpaced, 0, 0), op(fuzzDestroy, iUpper, 0, 0), op(fuzzDestroy, iNth(0), 0, 0), op(fuzzDestroy, iNth(0), 0, 0),
		}},
		{"defragment", []fuzzOp{
			op(fuzzCreate, tAlpha, pMIG1, gMIG), op(fuzzCreate, tAlpha, pMIG1, gMIG), op(fuzzCreate, tBeta, pMIG1, gMIG),
			op(fuzzCreate, tAlpha, pMIG1, gMIG), op(fuzzCreate, tBeta, pMIG1, gMIG), op(fuzzCreate, tAlpha, pMIG1, gMIG),
			op(fuzzDestroy, iNth(0), 0, 0), op(fuzzDestroy, iNth(1), 0, 0), op(fuzzDestroy, iNth(2), 0, 0),
			op(fuzzDefragment, pMIG3, tEmpty, gAny), op(fuzzDefragment, pMIG3, tAlpha, gUnknown), op(fuzzDefragment, pEmpty, tAlpha, gAny),
			op(fuzzDefragment, pMIG3, tGamma, gAny), op(fuzzDefragment, pMIG3, tAlpha, gMIG), op(fuzzCreate, tAlpha, pMIG3, gMIG),
		}},
		{"apply-documents", []fuzzOp{
			op(fuzzCreate, tBeta, pL4, gAny), op(fuzzApply, docEmptyTenant, 0, 0), op(fuzzApply, docL4A10, 0, 0),
			op(fuzzApply, docPruneMIG, 0, 0), op(fuzzApply, 4, 0, 0), op(fuzzApply, 5, 0, 0), op(fuzzApply, 6, 0, 0),
			op(fuzzApply, 7, 0, 0), op(fuzzApply, docAllEmpty, 0, 0),
		}},
		{"create-and-attach", []fuzzOp{
			op(fuzzCreateAttach, tAlpha, pL4, vm1), op(fuzzCreateAttach, tEmpty, pL4, vm1), op(fuzzCreateAttach, tAlpha, pEmpty, vm1),
			op(fuzzCreateAttach, tAlpha, pL4, vmEmpty), op(fuzzCreateAttach, tAlpha, pMIG1, vm2), op(fuzzCreateAttach, tBeta, pA10, 4),
			op(fuzzUndefine, tAlpha, 0, 1),
		}},
		// An mdev another tool made, whose UUID a create asks for: refused
		// every time, in either case, while a free UUID is created once
		// and its retry returns the same instance.
		{"foreign-mdev-uuid", []fuzzOp{
			op(fuzzCreateUUID, tAlpha, pA10, uForeign), op(fuzzCreateUUID, tAlpha, pA10, uForeign), op(fuzzCreateUUID, tBeta, pA10, uForeignUpper),
			op(fuzzCreateUUID, tAlpha, pL4, uForeign), op(fuzzCreateUUID, tAlpha, pA10, uNil), op(fuzzCreateUUID, tAlpha, pMIG1, uNilURN),
			op(fuzzCreateUUID, tAlpha, pA10, uFree), op(fuzzCreateUUID, tAlpha, pA10, uFree), op(fuzzDestroy, iNth(0), 0, 0),
			op(fuzzCreateUUID, tAlpha, pA10, uForeign),
		}},
		// Hostile entries in mdevctl's directory, one after the other under
		// the foreign mdev's name and another, with creates between them.
		{"mdevctl-directory", []fuzzOp{
			op(fuzzMdevctl, mFIFO, nForeign, 0), op(fuzzCreate, tAlpha, pA10, gAny), op(fuzzMdevctl, mZeroLink, nOther, 0),
			op(fuzzMdevctl, mFIFOLink, nForeign, 0), op(fuzzMdevctl, mDevice, nOther, 0), op(fuzzCreateUUID, tAlpha, pA10, uForeign),
			op(fuzzMdevctl, mDir, nForeign, 0), op(fuzzMdevctl, mHuge, nOther, 0), op(fuzzMdevctl, mHuge, nForeign, 0),
			op(fuzzCreate, tBeta, pA10, gAny),
		}},
		{"tenant-lifecycle", []fuzzOp{
			op(fuzzDefine, tGamma, 1, 0), op(fuzzDefine, tEmpty, 0, 0), op(fuzzDefine, tSpace, 0, 0), op(fuzzDefine, tUpper, 0, 0),
			op(fuzzDefine, tGamma, 2, 0), op(fuzzCreate, tGamma, pA10, gAny), op(fuzzCreate, tGamma, pA10, gAny), op(fuzzCreate, tGamma, pA10, gAny),
			op(fuzzUndefine, tGamma, 0, 0), op(fuzzUndefine, tGamma, 0, 1), op(fuzzCreate, tGamma, pA10, gAny),
		}},
	}
}
