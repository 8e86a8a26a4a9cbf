package sim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML sessions: a process that initialises NVML holds the GPUs it opens
// (their device files) until it shuts NVML down or exits. While one is
// held the driver refuses a GPU reset (nvidia-smi -r: "in use by another
// client") and sriov-manage -d ("Cannot obtain unbindLock"). The
// simulator keeps the holders in the host state, so that every process
// sharing the host directory sees them, each with its process id: a
// holder whose process is gone holds nothing, as the kernel closes a dead
// process's files. Modelled where options.nvmlSessions is set
// (docs/simulator.md).

// nvmlSession is one holder of a GPU.
type nvmlSession struct {
	// PID is the holding process; 0: a client that holds the GPU until
	// told otherwise (OpenSession: dcgm, an exporter).
	PID int `json:"pid"`
	// Lib tells apart the NVML libraries of one process.
	Lib  string `json:"lib,omitempty"`
	Name string `json:"name"`
}

// alive: the session's process still runs.
func (s nvmlSession) alive() bool {
	if s.PID == 0 {
		return true
	}
	err := syscall.Kill(s.PID, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// holders names the processes holding an NVML session on g.
func (g *gpuState) holders() []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range g.Sessions {
		if !s.alive() {
			continue
		}
		n := s.Name
		if s.PID != 0 {
			n = fmt.Sprintf("%s (pid %d)", s.Name, s.PID)
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// dropSessions removes g's sessions that drop matches and those of dead
// processes; it reports whether any went.
func (g *gpuState) dropSessions(drop func(nvmlSession) bool) bool {
	kept := g.Sessions[:0]
	for _, s := range g.Sessions {
		if s.alive() && !drop(s) {
			kept = append(kept, s)
		}
	}
	changed := len(kept) != len(g.Sessions)
	g.Sessions = kept
	if len(g.Sessions) == 0 {
		g.Sessions = nil
	}
	return changed
}

// resetBlockers says what makes the driver refuse a reset of g, "" when
// nothing does (reference 3.5; docs/simulator.md, "What the driver
// refuses").
func (g *gpuState) resetBlockers() string {
	var why []string
	for _, v := range g.vgpus() {
		if v.VM != "" {
			why = append(why, fmt.Sprintf("VM %s holds a vGPU", v.VM))
		}
	}
	if n := len(g.vgpus()); n > 0 {
		why = append(why, fmt.Sprintf("%d vGPUs exist", n))
	}
	if len(g.GIs) > 0 {
		why = append(why, fmt.Sprintf("%d GPU instances exist", len(g.GIs)))
	}
	if g.VFsEnabled {
		why = append(why, "its SR-IOV VFs are enabled")
	}
	if h := g.holders(); len(h) > 0 {
		why = append(why, "NVML sessions are open by "+strings.Join(h, ", "))
	}
	return strings.Join(why, "; ")
}

var libSeq atomic.Uint64

func newLibID() string { return fmt.Sprintf("%d.%d", os.Getpid(), libSeq.Add(1)) }

func processName() string { return filepath.Base(os.Args[0]) }

// openSessions opens this library's session on every GPU not released
// (at its first Init), where the host models sessions.
func (l *lib) openSessions() {
	_ = l.h.mutate(func(st *state) (bool, error) {
		if !st.Spec.Options.NVMLSessions {
			return false, nil
		}
		changed := false
		for _, g := range st.GPUs {
			changed = g.dropSessions(func(nvmlSession) bool { return false }) || changed
			if l.isReleased(g.UUID) || g.heldBy(l.id) {
				continue
			}
			g.Sessions = append(g.Sessions, nvmlSession{PID: os.Getpid(), Lib: l.id, Name: processName()})
			changed = true
		}
		return changed, nil
	})
}

// closeSessions closes this library's sessions (at its last Shutdown).
func (l *lib) closeSessions() {
	_ = l.h.mutate(func(st *state) (bool, error) {
		changed := false
		for _, g := range st.GPUs {
			changed = g.dropSessions(func(s nvmlSession) bool { return s.Lib == l.id }) || changed
		}
		return changed, nil
	})
}

func (g *gpuState) heldBy(lib string) bool {
	for _, s := range g.Sessions {
		if s.Lib == lib {
			return true
		}
	}
	return false
}

func (l *lib) isReleased(uuid string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.released[uuid]
}

// ReleaseGPU closes this library's session on one GPU (its device files)
// while the library stays initialised for the others: what a client does
// before it resets the GPU or disables its VFs. Calls on the GPU's
// handles keep working in the simulator; a real client makes none until
// ReopenGPU. NOT_FOUND for an unknown GPU.
func (l *lib) ReleaseGPU(uuid string) nvml.Return {
	return l.sessionOn(uuid, false)
}

// ReopenGPU opens this library's session on the GPU again.
func (l *lib) ReopenGPU(uuid string) nvml.Return {
	return l.sessionOn(uuid, true)
}

func (l *lib) sessionOn(uuid string, open bool) nvml.Return {
	l.mu.Lock()
	if l.released == nil {
		l.released = map[string]bool{}
	}
	if open {
		delete(l.released, uuid)
	} else {
		l.released[uuid] = true
	}
	inited := l.inits > 0
	l.mu.Unlock()
	ret := nvml.SUCCESS
	err := l.h.mutate(func(st *state) (bool, error) {
		g := st.gpu(uuid)
		if g == nil {
			ret = nvml.ERROR_NOT_FOUND
			return false, nil
		}
		changed := g.dropSessions(func(s nvmlSession) bool { return s.Lib == l.id })
		if open && inited && st.Spec.Options.NVMLSessions {
			g.Sessions = append(g.Sessions, nvmlSession{PID: os.Getpid(), Lib: l.id, Name: processName()})
			changed = true
		}
		return changed, nil
	})
	if err != nil {
		return nvml.ERROR_UNKNOWN
	}
	return ret
}

// OpenSession simulates another NVML client (dcgm, an exporter,
// nvidia-persistenced) holding the GPU until CloseSession.
func (h *Host) OpenSession(id, name string) error {
	return h.mutate(func(st *state) (bool, error) {
		g := st.gpu(id)
		if g == nil {
			return false, fmt.Errorf("%w: %s", ErrNoSuchGPU, id)
		}
		g.Sessions = append(g.Sessions, nvmlSession{Name: name})
		return true, nil
	})
}

// CloseSession ends the sessions OpenSession gave name on the GPU.
func (h *Host) CloseSession(id, name string) error {
	return h.mutate(func(st *state) (bool, error) {
		g := st.gpu(id)
		if g == nil {
			return false, fmt.Errorf("%w: %s", ErrNoSuchGPU, id)
		}
		return g.dropSessions(func(s nvmlSession) bool { return s.PID == 0 && s.Name == name }), nil
	})
}

// Sessions names the processes holding an NVML session on the GPU.
func (h *Host) Sessions(id string) ([]string, error) {
	var out []string
	err := h.view(func(st *state) error {
		g := st.gpu(id)
		if g == nil {
			return fmt.Errorf("%w: %s", ErrNoSuchGPU, id)
		}
		out = g.holders()
		return nil
	})
	return out, err
}
