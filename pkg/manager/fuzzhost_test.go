package manager_test

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/virt"
)

// What FuzzManagerOperations checks against: the catalog's cost of an
// instance and the host as discovered (the crash test's checks, in
// internal/invariant), and libvirt: a fake that keeps each VM's config in
// memory.

// fuzzVirt is libvirt as the fuzz target needs it: persistent VMs that
// are stopped (attaches change the config only, and defragment may move
// their instances), each config a set of hostdevs with the instance vgpud
// recorded for each. It refuses what libvirt refuses: an empty or unknown
// name, another host's URI, a device or instance another VM holds.
type fuzzVirt struct {
	mu  sync.Mutex
	vms map[string]*fuzzVM
}

type fuzzVM struct {
	uuid string
	devs map[string]string // hostdev -> instance
}

const fuzzURI = "qemu:///system"

var _ manager.Virt = (*fuzzVirt)(nil)

// resolve is the VM name a reference names, "" when none.
func (v *fuzzVirt) resolve(ref string) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	name, _, err := v.lookup(ref)
	if err != nil {
		return ""
	}
	return name
}

func (v *fuzzVirt) lookup(ref string) (string, *fuzzVM, error) {
	name := ref
	if strings.Contains(ref, "://") {
		i := strings.LastIndex(ref, "/")
		if ref[:i] != fuzzURI {
			return "", nil, fmt.Errorf("domain %q: %w", ref, virt.ErrOtherHost)
		}
		name = ref[i+1:]
	}
	vm, ok := v.vms[name]
	if !ok {
		return "", nil, fmt.Errorf("domain %q: %w", ref, virt.ErrDomainNotFound)
	}
	return name, vm, nil
}

func fuzzHostdevKey(h virt.Hostdev) string {
	if h.Kind == virt.Mdev {
		return "mdev " + h.MdevUUID
	}
	return "pci " + h.PCI
}

func (v *fuzzVirt) URI() string { return fuzzURI }

func (v *fuzzVirt) Domain(_ context.Context, ref string) (virt.Domain, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	name, vm, err := v.lookup(ref)
	if err != nil {
		return virt.Domain{}, err
	}
	return virt.Domain{Name: name, UUID: vm.uuid, Persistent: true}, nil
}

func (v *fuzzVirt) Attach(_ context.Context, domain string, h virt.Hostdev, instance string) (bool, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if instance == "" || (h.MdevUUID == "" && h.PCI == "") {
		return false, fmt.Errorf("instance %q, hostdev %+v: %w", instance, h, virt.ErrInvalidHostdev)
	}
	name, vm, err := v.lookup(domain)
	if err != nil {
		return false, err
	}
	k := fuzzHostdevKey(h)
	for other, o := range v.vms {
		if other == name {
			continue
		}
		for dk, id := range o.devs {
			if dk == k || id == instance {
				return false, fmt.Errorf("%s (instance %s) is in %s: %w", k, instance, other, virt.ErrAttachedElsewhere)
			}
		}
	}
	vm.devs[k] = instance
	return false, nil
}

func (v *fuzzVirt) Detach(_ context.Context, domain string, h virt.Hostdev, instance string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, vm, err := v.lookup(domain)
	if err != nil {
		return err
	}
	delete(vm.devs, fuzzHostdevKey(h))
	for k, id := range vm.devs {
		if id == instance {
			delete(vm.devs, k)
		}
	}
	return nil
}

func (v *fuzzVirt) Attached(_ context.Context, ref string) ([]virt.Attached, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, vm, err := v.lookup(ref)
	if err != nil {
		return nil, err
	}
	var out []virt.Attached
	for k, id := range vm.devs {
		h := virt.Hostdev{Kind: virt.VF, PCI: strings.TrimPrefix(k, "pci ")}
		if strings.HasPrefix(k, "mdev ") {
			h = virt.Hostdev{Kind: virt.Mdev, MdevUUID: strings.TrimPrefix(k, "mdev ")}
		}
		out = append(out, virt.Attached{Instance: id, Hostdev: h, Config: true, MetadataConfig: true})
	}
	return out, nil
}

func (v *fuzzVirt) Domains(context.Context) ([]virt.Domain, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []virt.Domain
	for name, vm := range v.vms {
		out = append(out, virt.Domain{Name: name, UUID: vm.uuid, Persistent: true})
	}
	return out, nil
}

func (v *fuzzVirt) Events(ctx context.Context) <-chan virt.Event {
	ch := make(chan virt.Event)
	go func() { <-ctx.Done(); close(ch) }()
	return ch
}

func (v *fuzzVirt) Quiesce(context.Context) error { return nil }

// diff compares the attachment records with the VMs' configs: a VM's
// hostdevs must be the devices of the instances recorded as attached to
// it, each with vgpud's entry for that instance.
func (v *fuzzVirt) diff(s fuzzState) []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	want := map[string]map[string]string{}
	var out []string
	for id, a := range s.atts {
		in, ok := s.insts[id]
		if !ok {
			continue
		}
		var k string
		switch {
		case in.MdevUUID != "":
			k = "mdev " + in.MdevUUID
		case in.VF != "":
			k = "pci " + in.VF
		case in.Kind == store.KindPassthrough:
			k = "pci " + in.GPUPCI
		default:
			out = append(out, fmt.Sprintf("instance %s is recorded as attached to %s but has no device", id, a.Domain))
			continue
		}
		if want[a.Domain] == nil {
			want[a.Domain] = map[string]string{}
		}
		want[a.Domain][k] = id
	}
	for name, vm := range v.vms {
		for k, id := range vm.devs {
			if w, ok := want[name][k]; !ok || w != id {
				out = append(out, fmt.Sprintf("%s's config holds %s for instance %s: no attachment record", name, k, id))
			}
		}
		for k, id := range want[name] {
			if got, ok := vm.devs[k]; !ok || got != id {
				out = append(out, fmt.Sprintf("%s's config lacks %s of instance %s, recorded as attached", name, k, id))
			}
		}
	}
	for name := range want {
		if _, ok := v.vms[name]; !ok {
			out = append(out, fmt.Sprintf("attachments recorded to %s, which is no VM", name))
		}
	}
	return out
}
