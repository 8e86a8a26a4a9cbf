package sim

import (
	"io/fs"
	"path"
	"sort"
	"strings"
	"syscall"
	"time"
)

// tree is the in-memory sysfs tree, with a directory index for ReadDir.
type tree struct {
	entries  map[string]entry
	children map[string][]string
}

func newTree(entries map[string]entry) *tree {
	t := &tree{entries: entries, children: map[string][]string{}}
	for p := range entries {
		dir, name := path.Split(p)
		dir = strings.TrimSuffix(dir, "/")
		t.children[dir] = append(t.children[dir], name)
	}
	for _, c := range t.children {
		sort.Strings(c)
	}
	return t
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
