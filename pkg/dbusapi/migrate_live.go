package dbusapi

import (
	"github.com/godbus/dbus/v5"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/virt"
)

// The methods that move a running VM live (docs/operations.md, "Moving
// VMs"): the destination's MigrationTarget, the source's
// PrecheckOutgoingLive and MigrateOutgoingLive. Versions travel as
// "major.minor.micro" strings.

// hostVersions reads the destination's versions as the D-Bus arguments
// carry them.
func hostVersions(host, libvirtV, qemu, kernel string) (virt.HostVersions, error) {
	out := virt.HostVersions{Host: host}
	for _, v := range []struct {
		name, s string
		dst     *virt.Version
	}{{"libvirt", libvirtV, &out.Libvirt}, {"qemu", qemu, &out.QEMU}, {"kernel", kernel, &out.Kernel}} {
		p, err := virt.ParseVersion(v.s)
		if err != nil {
			return out, invalidArg("the destination's %s version: %v", v.name, err)
		}
		*v.dst = p
	}
	return out, nil
}

func (s *Service) migrationTarget(c *call, options map[string]dbus.Variant) (string, string, string, string, error) {
	ctx, end, err := c.begin(newOpts(c.member, options))
	if err != nil {
		return "", "", "", "", err
	}
	defer end()
	v, err := s.m.MigrationTarget(ctx)
	if err != nil {
		return "", "", "", "", cancelled(ctx, err)
	}
	return v.Host, v.Libvirt.String(), v.QEMU.String(), v.Kernel.String(), nil
}

func (s *Service) precheckOutgoingLive(c *call, id, host, libvirtV, qemu, kernel string, options map[string]dbus.Variant) error {
	dst, err := hostVersions(host, libvirtV, qemu, kernel)
	if err != nil {
		return err
	}
	ctx, end, err := c.begin(newOpts(c.member, options))
	if err != nil {
		return err
	}
	defer end()
	return cancelled(ctx, s.m.PrecheckOutgoingLive(ctx, id, dst))
}

func (s *Service) migrateOutgoingLive(c *call, id, device, destURI, migrateURI, host, libvirtV, qemu, kernel string, keepSource bool, options map[string]dbus.Variant) error {
	dst, err := hostVersions(host, libvirtV, qemu, kernel)
	if err != nil {
		return err
	}
	ctx, end, err := c.begin(newOpts(c.member, options))
	if err != nil {
		return err
	}
	defer end()
	err = s.m.MigrateOutgoingLive(ctx, id, manager.LiveOutgoing{Device: device, DestURI: destURI, MigrateURI: migrateURI, Dest: dst, KeepSource: keepSource})
	s.sync()
	return cancelled(ctx, err)
}
