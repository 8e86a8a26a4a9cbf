package manager

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Crash points, one per step boundary of every operation. Tests make the
// daemon die at one of them (CrashAt) to prove that reconcile finishes or
// undoes what was in flight.
const (
	CrashCreateIntent = "create.after-intent"
	CrashCreateGI     = "create.after-gpu-instance"
	CrashCreateCI     = "create.after-compute-instance"
	CrashCreateVGPU   = "create.after-sysfs-write"
	CrashCreateCommit = "create.before-commit"
	CrashDestroyStart = "destroy.after-intent"
	CrashDestroyVGPU  = "destroy.after-sysfs-write"
	CrashDestroyCI    = "destroy.after-compute-instance"
	CrashDestroyGI    = "destroy.after-gpu-instance"
	CrashAttachIntent = "attach.after-intent"
	CrashAttachDone   = "attach.before-commit"
	CrashDetachIntent = "detach.after-intent"
	CrashDetachDone   = "detach.before-commit"
	CrashCreateAttach = "create-attach.after-create"
	CrashMoveRelease  = "move.after-release"
	CrashMoveCarve    = "move.after-carve"
	CrashReconcile    = "reconcile.after-step"
	// CrashRestore: an instance a reboot lost was carved again and its
	// record written, while the other GPUs' workers carve on (restoreAll).
	CrashRestore = "reconcile.after-recreate"
	// The MIG mode change carried through a GPU reset (migreset.go).
	CrashMIGIntent  = "mig-mode.after-intent"
	CrashMIGRelease = "mig-mode.after-release"
	CrashMIGVFsOff  = "mig-mode.after-vfs-off"
	CrashMIGReset   = "mig-mode.after-reset"
	CrashMIGVFsOn   = "mig-mode.after-vfs-on"
	// Moving a VM to another host (migrate.go, incoming.go).
	CrashOutgoingIntent   = "outgoing.after-intent"
	CrashOutgoingMove     = "outgoing.after-move"
	CrashIncomingIntent   = "incoming.after-intent"
	CrashIncomingCarve    = "incoming.after-carve"
	CrashIncomingCommit   = "incoming.before-commit"
	CrashMigrationRelease = "migration.after-release-intent"
)

// CrashPoints lists every crash point of the manager's operations (the
// fleet's sync pass has its own: fleet.CrashPoints).
var CrashPoints = []string{
	CrashCreateIntent, CrashCreateGI, CrashCreateCI, CrashCreateVGPU, CrashCreateCommit,
	CrashDestroyStart, CrashDestroyVGPU, CrashDestroyCI, CrashDestroyGI,
	CrashAttachIntent, CrashAttachDone, CrashDetachIntent, CrashDetachDone, CrashCreateAttach,
	CrashMoveRelease, CrashMoveCarve, CrashReconcile, CrashRestore,
	CrashMIGIntent, CrashMIGRelease, CrashMIGVFsOff, CrashMIGReset, CrashMIGVFsOn,
	CrashOutgoingIntent, CrashOutgoingMove, CrashIncomingIntent, CrashIncomingCarve, CrashIncomingCommit, CrashMigrationRelease,
}

// CrashAt returns a crash hook that kills the process with SIGKILL (no
// deferred cleanup, as a power cut or kill -9) the nth time point is
// reached. spec is "point" or "point:n", e.g. from $VGPUD_CRASH_AT; point
// is one of CrashPoints or of more, the crash points of the other packages
// the daemon gives the same hook (fleet.CrashPoints).
func CrashAt(spec string, more ...string) (func(string), error) {
	if spec == "" {
		return nil, nil
	}
	point, nth := spec, 1
	if p, n, ok := strings.Cut(spec, ":"); ok {
		v, err := strconv.Atoi(n)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("crash point %q: count must be a positive integer", spec)
		}
		point, nth = p, v
	}
	all := append(append([]string(nil), CrashPoints...), more...)
	known := false
	for _, c := range all {
		known = known || c == point
	}
	if !known {
		return nil, fmt.Errorf("unknown crash point %q (known: %s)", point, strings.Join(all, ", "))
	}
	var mu sync.Mutex
	hits := 0
	return func(p string) {
		if p != point {
			return
		}
		mu.Lock()
		hits++
		h := hits
		mu.Unlock()
		if h == nth {
			fmt.Fprintf(os.Stderr, "vgpud: crash point %s reached: killing myself\n", p)
			// Its error is of no use: should the signal not come, the select
			// below stops the operation at this point all the same.
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}, nil
}
