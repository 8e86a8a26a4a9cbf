package dbusapi

import (
	"fmt"
	"strings"

	"github.com/godbus/dbus/v5"
	"github.com/google/uuid"
)

// Names on the bus. The "1" is the API's major version: an incompatible
// change gets dev.vgpud2 beside it, as org.freedesktop.login1 does.
const (
	BusName     = "dev.vgpud1"
	ManagerPath = dbus.ObjectPath("/dev/vgpud1")

	ManagerInterface  = "dev.vgpud1.Manager"
	GPUInterface      = "dev.vgpud1.GPU"
	InstanceInterface = "dev.vgpud1.Instance"
	TenantInterface   = "dev.vgpud1.Tenant"

	// ErrorPrefix prefixes the error names: dev.vgpud1.Error.NotFound, ...
	ErrorPrefix = "dev.vgpud1.Error."

	// PolkitAction is the polkit action that lets a caller who is neither
	// root nor in group vgpud make changes.
	PolkitAction = "dev.vgpud1.manage"

	gpuDir      = ManagerPath + "/gpu"
	instanceDir = ManagerPath + "/instance"
	tenantDir   = ManagerPath + "/tenant"

	propertiesInterface    = "org.freedesktop.DBus.Properties"
	objectManagerInterface = "org.freedesktop.DBus.ObjectManager"
	introspectInterface    = "org.freedesktop.DBus.Introspectable"
	peerInterface          = "org.freedesktop.DBus.Peer"
)

// GPUPath is the object of the GPU at a PCI address: 0000:41:00.0 is
// /dev/vgpud1/gpu/pci_0000_41_00_0 (libvirt's node device spelling).
func GPUPath(pci string) dbus.ObjectPath {
	r := strings.NewReplacer(":", "_", ".", "_")
	return gpuDir + "/pci_" + dbus.ObjectPath(r.Replace(strings.ToLower(pci)))
}

// InstancePath is the object of an instance: its UUID with '_' for '-'.
func InstancePath(id string) dbus.ObjectPath {
	return instanceDir + "/" + dbus.ObjectPath(strings.ReplaceAll(strings.ToLower(id), "-", "_"))
}

// TenantPath is the object of a tenant: its name with '_' for '-' (tenant
// names are DNS labels, so the mapping is one to one).
func TenantPath(name string) dbus.ObjectPath {
	return tenantDir + "/" + dbus.ObjectPath(strings.ReplaceAll(name, "-", "_"))
}

// objKind is what an object path names.
type objKind int

const (
	kindNone objKind = iota
	kindRoot         // "/", "/dev": introspection only
	kindManager
	kindDir // /dev/vgpud1/gpu, /instance, /tenant
	kindGPU
	kindInstance
	kindTenant
)

// parsePath says what a path names and the id inside it (PCI address,
// instance UUID or tenant name). A syntactically valid object path that no
// object has still parses: callers answer NotFound after authorizing, so
// the existence of an id does not leak to callers who may not read.
func parsePath(p dbus.ObjectPath) (objKind, string) {
	s := string(p)
	switch s {
	case "/", "/dev":
		return kindRoot, ""
	case string(ManagerPath):
		return kindManager, ""
	case string(gpuDir), string(instanceDir), string(tenantDir):
		return kindDir, ""
	}
	dir, leaf, ok := cut(s)
	if !ok {
		return kindNone, ""
	}
	switch dir {
	case string(gpuDir):
		if pci, ok := parseGPULeaf(leaf); ok {
			return kindGPU, pci
		}
	case string(instanceDir):
		if u, err := uuid.Parse(strings.ReplaceAll(leaf, "_", "-")); err == nil && len(leaf) == 36 {
			return kindInstance, u.String()
		}
	case string(tenantDir):
		if leaf != "" {
			return kindTenant, strings.ReplaceAll(leaf, "_", "-")
		}
	}
	return kindNone, ""
}

func cut(s string) (dir, leaf string, ok bool) {
	i := strings.LastIndexByte(s, '/')
	if i <= 0 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

// parseGPULeaf reads pci_DDDD_BB_SS_F back into DDDD:BB:SS.F.
func parseGPULeaf(leaf string) (string, bool) {
	rest, ok := strings.CutPrefix(leaf, "pci_")
	if !ok {
		return "", false
	}
	parts := strings.Split(rest, "_")
	if len(parts) != 4 || len(parts[0]) != 4 || len(parts[1]) != 2 || len(parts[2]) != 2 || len(parts[3]) != 1 {
		return "", false
	}
	return fmt.Sprintf("%s:%s:%s.%s", parts[0], parts[1], parts[2], parts[3]), true
}

// InstanceID returns the instance UUID an instance object path names.
func InstanceID(p dbus.ObjectPath) (string, bool) {
	k, id := parsePath(p)
	return id, k == kindInstance
}

// TenantName returns the tenant name a tenant object path names.
func TenantName(p dbus.ObjectPath) (string, bool) {
	k, id := parsePath(p)
	return id, k == kindTenant
}

// GPUAddress returns the PCI address a GPU object path names.
func GPUAddress(p dbus.ObjectPath) (string, bool) {
	k, id := parsePath(p)
	return id, k == kindGPU
}
