package sim

import (
	"encoding/json"
	"io/fs"
	"path"
	"sort"
	"strings"
	"syscall"
	"time"
)

// tree is the in-memory sysfs tree, with a directory index for ReadDir.
// It is kept per GPU so that a mutation re-renders only the GPUs whose
// state changed.
type tree struct {
	entries  map[string]entry
	children map[string][]string
	owned    map[string]map[string]entry // GPU PCI address -> its entries
	fp       map[string]string           // GPU PCI address -> state fingerprint
	globalFP string
}

// updateTree brings the tree to the state, re-rendering the GPUs whose
// state (or the host-wide settings) changed.
func (h *Host) updateTree() {
	gfp, _ := json.Marshal(struct {
		Loaded bool
		Opts   Options
		N      int
	}{h.st.DriverLoaded, h.st.Spec.Options, len(h.st.GPUs)})
	t := h.tree
	if t == nil || t.globalFP != string(gfp) {
		t = &tree{entries: map[string]entry{}, children: map[string][]string{}, owned: map[string]map[string]entry{},
			fp: map[string]string{}, globalFP: string(gfp)}
		global := map[string]entry{}
		h.globalEntries(global)
		t.replace(nil, global)
		h.tree = t
	}
	for _, g := range h.st.GPUs {
		fp, _ := json.Marshal(g)
		if t.fp[g.PCI] == string(fp) {
			continue
		}
		next := map[string]entry{}
		h.gpuEntries(g, next)
		t.replace(t.owned[g.PCI], next)
		t.owned[g.PCI], t.fp[g.PCI] = next, string(fp)
	}
}

// replace swaps one owner's old entries for next.
func (t *tree) replace(old, next map[string]entry) {
	for p := range old {
		if _, keep := next[p]; keep {
			continue
		}
		delete(t.entries, p)
		dir, name := split(p)
		c := t.children[dir]
		if i := sort.SearchStrings(c, name); i < len(c) && c[i] == name {
			t.children[dir] = append(c[:i], c[i+1:]...)
		}
	}
	for p, e := range next {
		if _, ok := t.entries[p]; !ok {
			dir, name := split(p)
			c := t.children[dir]
			i := sort.SearchStrings(c, name)
			c = append(c, "")
			copy(c[i+1:], c[i:])
			c[i] = name
			t.children[dir] = c
		}
		t.entries[p] = e
	}
}

func split(p string) (dir, name string) {
	dir, name = path.Split(p)
	return strings.TrimSuffix(dir, "/"), name
}

// maxLinks bounds symlink resolution, as the kernel's 40 does.
const maxLinks = 40

// resolve follows symlinks in every component of p (and in the last one
// when follow is set) and returns the canonical path and its entry.
func (t *tree) resolve(p string, follow bool) (string, entry, error) {
	parts := strings.Split(p, "/")
	cur := ""
	hops := 0
	for i := 0; i < len(parts); i++ {
		name := parts[i]
		switch name {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			if cur == "." {
				cur = ""
			}
			continue
		}
		next := name
		if cur != "" {
			next = cur + "/" + name
		}
		e, ok := t.entries[next]
		if !ok {
			return "", entry{}, syscall.ENOENT
		}
		last := i == len(parts)-1
		if e.kind == 'l' && (!last || follow) {
			hops++
			if hops > maxLinks {
				return "", entry{}, syscall.ELOOP
			}
			rest := append(strings.Split(e.data, "/"), parts[i+1:]...)
			parts = append(strings.Split(cur, "/"), rest...)
			cur, i = "", -1
			continue
		}
		if !last && e.kind != 'd' {
			return "", entry{}, syscall.ENOTDIR
		}
		cur = next
	}
	if cur == "" {
		return "", entry{kind: 'd'}, nil
	}
	return cur, t.entries[cur], nil
}

// fileInfo is a tree entry as fs.FileInfo and fs.DirEntry.
type fileInfo struct {
	name string
	e    entry
}

func (f fileInfo) Name() string { return f.name }
func (f fileInfo) Size() int64  { return int64(len(f.e.data)) }
func (f fileInfo) Mode() fs.FileMode {
	switch f.e.kind {
	case 'd':
		return fs.ModeDir | 0o755
	case 'l':
		return fs.ModeSymlink | 0o777
	}
	return 0o644
}
func (f fileInfo) ModTime() time.Time         { return time.Time{} }
func (f fileInfo) IsDir() bool                { return f.e.kind == 'd' }
func (f fileInfo) Sys() any                   { return nil }
func (f fileInfo) Type() fs.FileMode          { return f.Mode().Type() }
func (f fileInfo) Info() (fs.FileInfo, error) { return f, nil }
