// Package dbusapi is vgpud's D-Bus API, dev.vgpud1 on the system bus, and
// its typed client.
//
// The service side (Start) exports, in the style of systemd's login1 and
// machine1, a manager object /dev/vgpud1 (dev.vgpud1.Manager and
// org.freedesktop.DBus.ObjectManager) and one object per GPU, instance and
// tenant (dev.vgpud1.GPU, .Instance, .Tenant), with read-only properties,
// PropertiesChanged on every change, and complete introspection data
// generated from the same declarations that dispatch the calls
// (interfaces.go). Each method only translates: it forwards to
// pkg/manager and maps the manager's sentinel errors to
// dev.vgpud1.Error.<Name> in one function (toDBusError). Callers are
// identified by the bus and authorized per method: reads for root and
// group vgpud, changes also through polkit's dev.vgpud1.manage.
//
// The client side (Dial) is what vgpuctl and Go orchestrators use: typed
// calls returning the JSON-ready types in types.go, errors as *Error with
// the error's name and its user-facing message.
//
// cmd/vgpud starts the service; cmd/vgpuctl and tests use the client.
//
// Imports: pkg/apply, pkg/gpu, pkg/manager, pkg/placement, pkg/tenant, pkg/virt.
package dbusapi
