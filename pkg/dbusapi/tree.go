package dbusapi

import (
	"fmt"
	"reflect"
	"slices"
	"sort"

	"github.com/godbus/dbus/v5"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
)

// object is one GPU, instance or tenant object with its properties.
type object struct {
	kind  objKind
	iface string
	props map[string]dbus.Variant
}

// snapshot is the object tree as the bus last saw it.
type snapshot struct {
	manager map[string]dbus.Variant
	objects map[dbus.ObjectPath]*object
}

func (s *snapshot) children(dir dbus.ObjectPath) []string {
	var out []string
	for p := range s.objects {
		if d, leaf, ok := cut(string(p)); ok && d == string(dir) {
			out = append(out, leaf)
		}
	}
	sort.Strings(out)
	return out
}

// build reads the manager's view into a snapshot.
func (s *Service) build() (*snapshot, error) {
	gpus, err := s.m.GPUs()
	if err != nil {
		return nil, fmt.Errorf("list GPUs: %w", err)
	}
	insts, err := s.m.AllInstances()
	if err != nil {
		return nil, fmt.Errorf("list instances: %w", err)
	}
	tenants, err := s.m.Tenants()
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	snap := &snapshot{objects: map[dbus.ObjectPath]*object{}}
	ms := managerState{version: s.opts.Version, degraded: s.m.Degraded(), driver: s.m.Inventory().Driver.Version}
	for i := range gpus {
		p := GPUPath(gpus[i].PCI)
		snap.objects[p] = &object{kind: kindGPU, iface: GPUInterface, props: valuesOf(gpuProps, &gpus[i])}
		ms.gpus = append(ms.gpus, p)
	}
	byTenant := map[string][]dbus.ObjectPath{}
	for i := range insts {
		p := InstancePath(insts[i].UUID)
		snap.objects[p] = &object{kind: kindInstance, iface: InstanceInterface, props: valuesOf(instanceProps, &insts[i])}
		ms.instances = append(ms.instances, p)
		byTenant[insts[i].Tenant] = append(byTenant[insts[i].Tenant], p)
	}
	for i := range tenants {
		p := TenantPath(tenants[i].Name)
		ts := tenantState{TenantView: tenants[i], instances: byTenant[tenants[i].Name]}
		sort.Slice(ts.instances, func(a, b int) bool { return ts.instances[a] < ts.instances[b] })
		snap.objects[p] = &object{kind: kindTenant, iface: TenantInterface, props: valuesOf(tenantProps, &ts)}
		ms.tenants = append(ms.tenants, p)
	}
	for _, l := range [][]dbus.ObjectPath{ms.gpus, ms.instances, ms.tenants} {
		sort.Slice(l, func(a, b int) bool { return l[a] < l[b] })
	}
	snap.manager = valuesOf(managerProps, &ms)
	return snap, nil
}

func (s *Service) current() *snapshot {
	s.snapMu.RLock()
	defer s.snapMu.RUnlock()
	return s.snap
}

// sync re-reads the manager and tells the bus what changed:
// InterfacesAdded for new objects, PropertiesChanged for changed
// properties, GPULost when a GPU becomes lost or failed, InterfacesRemoved
// for objects that are gone. Callers serialize on syncMu so signals go out
// in the order the changes happened; a mutating method syncs before it
// replies, so its caller's subscribers have the signals first.
func (s *Service) sync() {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	next, err := s.build()
	if err != nil {
		s.log.Warn("refresh D-Bus objects", "err", err)
		return
	}
	s.snapMu.Lock()
	prev := s.snap
	s.snap = next
	s.snapMu.Unlock()
	if prev == nil {
		return
	}
	s.emitDiff(prev, next)
}

// objectInterfaces are the interfaces every GPU, instance and tenant
// object has besides its own.
var objectInterfaces = []string{propertiesInterface, introspectInterface, peerInterface}

func (s *Service) emitDiff(prev, next *snapshot) {
	paths := func(m map[dbus.ObjectPath]*object) []dbus.ObjectPath {
		out := make([]dbus.ObjectPath, 0, len(m))
		for p := range m {
			out = append(out, p)
		}
		// Tenants, then GPUs, then instances: an added instance's tenant
		// object exists when the instance appears.
		rank := map[objKind]int{kindTenant: 0, kindGPU: 1, kindInstance: 2}
		sort.Slice(out, func(i, j int) bool {
			ri, rj := rank[m[out[i]].kind], rank[m[out[j]].kind]
			if ri != rj {
				return ri < rj
			}
			return out[i] < out[j]
		})
		return out
	}
	for _, p := range paths(next.objects) {
		if _, ok := prev.objects[p]; ok {
			continue
		}
		o := next.objects[p]
		ifaces := map[string]map[string]dbus.Variant{o.iface: o.props}
		for _, i := range objectInterfaces {
			ifaces[i] = map[string]dbus.Variant{}
		}
		s.emit(ManagerPath, objectManagerInterface+".InterfacesAdded", p, ifaces)
	}
	for _, p := range paths(next.objects) {
		old, ok := prev.objects[p]
		if !ok {
			continue
		}
		o := next.objects[p]
		if ch := changed(old.props, o.props); len(ch) > 0 {
			s.emit(p, propertiesInterface+".PropertiesChanged", o.iface, ch, []string{})
		}
		if o.kind == kindGPU {
			was, _ := old.props["State"].Value().(string)
			now, _ := o.props["State"].Value().(string)
			if now != was && (now == string(gpu.StateLost) || now == string(gpu.StateFailed)) {
				pci, _ := o.props["PCI"].Value().(string)
				uuid, _ := o.props["UUID"].Value().(string)
				reason, _ := o.props["Reason"].Value().(string)
				if reason == "" {
					reason = now
				}
				s.emit(ManagerPath, ManagerInterface+".GPULost", pci, uuid, reason)
			}
		}
	}
	if ch := changed(prev.manager, next.manager); len(ch) > 0 {
		s.emit(ManagerPath, propertiesInterface+".PropertiesChanged", ManagerInterface, ch, []string{})
	}
	// Removals in the reverse order: a tenant's instances go before the
	// tenant (a forced undefine), so no instance outlives its tenant.
	gone := paths(prev.objects)
	slices.Reverse(gone)
	for _, p := range gone {
		if _, ok := next.objects[p]; ok {
			continue
		}
		s.emit(ManagerPath, objectManagerInterface+".InterfacesRemoved", p, append([]string{prev.objects[p].iface}, objectInterfaces...))
	}
}

func changed(old, now map[string]dbus.Variant) map[string]dbus.Variant {
	out := map[string]dbus.Variant{}
	for k, v := range now {
		if o, ok := old[k]; !ok || !reflect.DeepEqual(o.Value(), v.Value()) {
			out[k] = v
		}
	}
	return out
}

func (s *Service) emit(path dbus.ObjectPath, name string, args ...any) {
	if err := s.conn.Emit(path, name, args...); err != nil {
		s.log.Warn("emit signal", "signal", name, "path", string(path), "err", err)
	}
}

// managerEventSignal turns a manager event into the Manager signal it
// stands for; state changes travel as PropertiesChanged and
// InterfacesAdded/Removed instead.
func (s *Service) emitEvent(e manager.Event) {
	switch e.Kind {
	case manager.EventOperationDone:
		s.emit(ManagerPath, ManagerInterface+".OperationFinished", e.Op, e.ID)
	case manager.EventOperationFailed:
		s.emit(ManagerPath, ManagerInterface+".OperationFailed", e.Op, e.ID, e.Detail)
	case manager.EventVM:
		s.emit(ManagerPath, ManagerInterface+".VMEvent", e.ID, e.Detail, e.Op)
	case manager.EventPolicySwitched:
		s.emit(ManagerPath, ManagerInterface+".PolicySwitched", e.ID, e.Detail)
	case manager.EventDrift:
		s.emit(ManagerPath, ManagerInterface+".HostDrift", e.Op, e.ID, e.Detail)
	}
}
