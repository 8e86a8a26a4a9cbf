package fleet

// Crash points of the sync pass, between its writes to Placement: a GPU
// provider the pass works on is there (made now or found), its
// inventories are synced (written if they differed), an instance's
// allocation written, an allocation of no instance removed. Tests make
// the daemon die at one of them (Config.Crash, manager.CrashAt) to prove
// that the next pass finishes what was cut off.
const (
	CrashProvider  = "fleet.after-provider"
	CrashInventory = "fleet.after-inventory"
	CrashAlloc     = "fleet.after-allocation"
	CrashUnalloc   = "fleet.after-allocation-removal"
)

// CrashPoints lists the sync pass's crash points (for manager.CrashAt).
var CrashPoints = []string{CrashProvider, CrashInventory, CrashAlloc, CrashUnalloc}
