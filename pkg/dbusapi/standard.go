package dbusapi

import (
	"fmt"

	"github.com/godbus/dbus/v5"

	"github.com/vgpud/vgpud/pkg/manager"
)

// The freedesktop interfaces every object has.
func (s *Service) standardInterfaces() []*ifaceDef {
	return []*ifaceDef{
		{
			name: propertiesInterface,
			doc:  "Properties of the object's dev.vgpud1 interface; all are read-only, and every change is signalled. Reading needs root or group vgpud (Manager.Version is public).",
			methods: []*methodDef{
				{name: "Get", access: accessPublic, fn: s.propGet,
					doc: "One property's value. Manager.Version is readable by anyone; the others need root or group vgpud.",
					in:  []arg{{name: "interface_name", doc: "The interface the property belongs to."}, {name: "property_name", doc: "The property."}},
					out: []arg{{name: "value", doc: "Its value."}}},
				{name: "GetAll", access: accessRead, fn: s.propGetAll,
					doc: "Every property of an interface of the object.",
					in:  []arg{{name: "interface_name", doc: "The interface."}},
					out: []arg{{name: "properties", doc: "Property name to value."}}},
				{name: "Set", access: accessManage, fn: s.propSet,
					doc: "Refused with PropertyReadOnly: every property is read-only; change state with the interface's methods.",
					in:  []arg{{name: "interface_name", doc: "The interface."}, {name: "property_name", doc: "The property."}, {name: "value", doc: "The value (never taken)."}}},
			},
			signals: []signalDef{{name: "PropertiesChanged", doc: "Properties of the object changed; emitted before the reply of the method that changed them.", args: []arg{
				{name: "interface_name", sig: "s", doc: "The interface whose properties changed."},
				{name: "changed_properties", sig: "a{sv}", doc: "The changed properties with their new values."},
				{name: "invalidated_properties", sig: "as", doc: "Always empty: every change carries its value."}}}},
		},
		{
			name: objectManagerInterface,
			doc:  "Every GPU, instance and tenant object with its properties, and InterfacesAdded/InterfacesRemoved as they come and go.",
			methods: []*methodDef{
				{name: "GetManagedObjects", access: accessRead, fn: s.getManagedObjects,
					doc: "Every GPU, instance and tenant object with all its properties, in one call.",
					out: []arg{{name: "objects", doc: "Object path to interface to properties."}}},
			},
			signals: []signalDef{
				{name: "InterfacesAdded", doc: "An object appeared (its tenant and GPU objects exist already).", args: []arg{
					{name: "object_path", sig: "o", doc: "The new object."},
					{name: "interfaces_and_properties", sig: "a{sa{sv}}", doc: "Its interfaces with all their properties."}}},
				{name: "InterfacesRemoved", doc: "An object went away (a tenant's instances go before the tenant).", args: []arg{
					{name: "object_path", sig: "o", doc: "The object that went away."},
					{name: "interfaces", sig: "as", doc: "Its interfaces."}}},
			},
		},
		{
			name: introspectInterface,
			doc:  "The object's interfaces, with their documentation. Anyone may introspect; child objects are listed only to callers who may read.",
			methods: []*methodDef{
				{name: "Introspect", access: accessPublic, fn: s.introspectMethod,
					doc: "The introspection XML of the object.",
					out: []arg{{name: "xml_data", doc: "The XML, with org.gtk.GDBus.DocString annotations."}}},
			},
		},
		{
			// godbus answers Peer itself; listed for introspection.
			name: peerInterface,
			doc:  "The standard D-Bus Peer interface: anyone may ping vgpud.",
			methods: []*methodDef{
				{name: "Ping", doc: "Answers at once; tells that vgpud is on the bus."},
				{name: "GetMachineId", doc: "The machine id of the host.", out: []arg{{name: "machine_uuid", sig: "s", doc: "The id, as /etc/machine-id has it."}}},
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
		return nil, apiErr(manager.ErrNotFound, "no GPU %s on this host (run `vgpuctl gpus`)", c.id)
	case kindInstance:
		return nil, apiErr(manager.ErrNotFound, "no instance %s (run `vgpuctl list`)", c.id)
	case kindTenant:
		return nil, apiErr(manager.ErrNotFound, "no tenant %s (run `vgpuctl tenant list`)", c.id)
	}
	return nil, apiErr(manager.ErrNotFound, "no object %s", c.path)
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
	ok, _, err := c.may(accessRead, false)
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
