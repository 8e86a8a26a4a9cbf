package dbusapi

import (
	"fmt"

	"github.com/godbus/dbus/v5"
)

// The freedesktop interfaces every object has.
func (s *Service) standardInterfaces() []*ifaceDef {
	return []*ifaceDef{
		{
			name: propertiesInterface,
			doc:  "Properties of the object's dev.vgpud1 interface; all are read-only, and every change is signalled. Reading needs root or group vgpud (Manager.Version is public).",
			methods: []*methodDef{
				{name: "Get", access: accessPublic, fn: s.propGet,
					in:  []arg{{name: "interface_name"}, {name: "property_name"}},
					out: []arg{{name: "value"}}},
				{name: "GetAll", access: accessRead, fn: s.propGetAll,
					in:  []arg{{name: "interface_name"}},
					out: []arg{{name: "properties"}}},
				{name: "Set", access: accessManage, fn: s.propSet,
					in: []arg{{name: "interface_name"}, {name: "property_name"}, {name: "value"}}},
			},
			signals: []signalDef{{name: "PropertiesChanged", args: []arg{
				{name: "interface_name", sig: "s"}, {name: "changed_properties", sig: "a{sv}"}, {name: "invalidated_properties", sig: "as"}}}},
		},
		{
			name: objectManagerInterface,
			doc:  "Every GPU, instance and tenant object with its properties, and InterfacesAdded/InterfacesRemoved as they come and go.",
			methods: []*methodDef{
				{name: "GetManagedObjects", access: accessRead, fn: s.getManagedObjects,
					out: []arg{{name: "objects", doc: "Object path to interface to properties."}}},
			},
			signals: []signalDef{
				{name: "InterfacesAdded", args: []arg{{name: "object_path", sig: "o"}, {name: "interfaces_and_properties", sig: "a{sa{sv}}"}}},
				{name: "InterfacesRemoved", args: []arg{{name: "object_path", sig: "o"}, {name: "interfaces", sig: "as"}}},
			},
		},
		{
			name: introspectInterface,
			methods: []*methodDef{
				{name: "Introspect", access: accessPublic, fn: s.introspectMethod, out: []arg{{name: "xml_data"}}},
			},
		},
		{
			// godbus answers Peer itself; listed for introspection.
			name: peerInterface,
			methods: []*methodDef{
				{name: "Ping"},
				{name: "GetMachineId", out: []arg{{name: "machine_uuid", sig: "s"}}},
			},
		},
	}
}

// lookup finds the object a call is about in the current snapshot, or a
// NotFound error that names it the way users know it.
func (c *call) lookup() (*object, error) {
	o := c.svc.current().objects[c.path]
	if o != nil {
		return o, nil
	}
	switch c.kind {
	case kindGPU:
		return nil, dbusError(NameNotFound, fmt.Sprintf("no GPU %s on this host (run `vgpuctl gpus`)", c.id))
	case kindInstance:
		return nil, dbusError(NameNotFound, fmt.Sprintf("no instance %s (run `vgpuctl list`)", c.id))
	case kindTenant:
		return nil, dbusError(NameNotFound, fmt.Sprintf("no tenant %s (run `vgpuctl tenant list`)", c.id))
	}
	return nil, dbusError(NameNotFound, fmt.Sprintf("no object %s", c.path))
}

// props returns the properties of the call's object on iface.
func (c *call) props(iface string) (map[string]dbus.Variant, error) {
	if c.kind == kindManager && iface == ManagerInterface {
		return c.svc.current().manager, nil
	}
	ifaces := objectIfaces(c.kind)
	known := false
	for _, n := range ifaces {
		known = known || n == iface
	}
	if !known {
		return nil, &dbus.Error{Name: "org.freedesktop.DBus.Error.UnknownInterface", Body: []any{fmt.Sprintf("object %s has no interface %s", c.path, iface)}}
	}
	switch iface {
	case GPUInterface, InstanceInterface, TenantInterface:
		o, err := c.lookup()
		if err != nil {
			return nil, err
		}
		return o.props, nil
	}
	return map[string]dbus.Variant{}, nil
}

func (s *Service) propGet(c *call, iface, name string) (dbus.Variant, error) {
	// Get is public for the public properties only; the rest need read.
	public := false
	if d := s.ifaces[iface]; d != nil && c.kind == kindManager {
		if p, ok := d.prop(name); ok {
			public = p.public
		}
	}
	if !public {
		if err := c.require(accessRead); err != nil {
			return dbus.Variant{}, err
		}
	}
	props, err := c.props(iface)
	if err != nil {
		return dbus.Variant{}, err
	}
	v, ok := props[name]
	if !ok {
		return dbus.Variant{}, &dbus.Error{Name: "org.freedesktop.DBus.Error.UnknownProperty", Body: []any{fmt.Sprintf("%s has no property %s", iface, name)}}
	}
	return v, nil
}

func (s *Service) propGetAll(c *call, iface string) (map[string]dbus.Variant, error) {
	return c.props(iface)
}

func (s *Service) propSet(c *call, iface, name string, _ dbus.Variant) error {
	return &dbus.Error{Name: "org.freedesktop.DBus.Error.PropertyReadOnly",
		Body: []any{fmt.Sprintf("%s.%s is read-only; change state with the interface's methods", iface, name)}}
}

func (s *Service) getManagedObjects(c *call) (map[dbus.ObjectPath]map[string]map[string]dbus.Variant, error) {
	if c.kind != kindManager {
		return nil, &dbus.Error{Name: "org.freedesktop.DBus.Error.UnknownMethod", Body: []any{"the object manager is " + string(ManagerPath)}}
	}
	snap := s.current()
	out := make(map[dbus.ObjectPath]map[string]map[string]dbus.Variant, len(snap.objects))
	for p, o := range snap.objects {
		ifaces := map[string]map[string]dbus.Variant{o.iface: o.props}
		for _, i := range objectInterfaces {
			ifaces[i] = map[string]dbus.Variant{}
		}
		out[p] = ifaces
	}
	return out, nil
}

func (s *Service) introspectMethod(c *call) (string, error) {
	ok, _, err := c.may(accessRead)
	reader := err == nil && ok
	switch c.kind {
	case kindGPU, kindInstance, kindTenant:
		// Readers learn that an object is absent; others get the
		// interface description either way, so nothing about what exists
		// leaks to them.
		if reader {
			if _, err := c.lookup(); err != nil {
				return "", err
			}
		}
	}
	return s.introspect(c.path, c.kind, reader), nil
}
