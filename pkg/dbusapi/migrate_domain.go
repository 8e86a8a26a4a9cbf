package dbusapi

import (
	"github.com/godbus/dbus/v5"
)

// The methods that move a shut-off VM's definition between two vgpud
// hosts, each vgpud acting on its own libvirt (docs/operations.md, "Moving
// VMs"): the source's OutgoingDomainXML and UndefineOutgoingDomain, the
// destination's DefineIncomingDomain and UndefineIncomingDomain.

// maxDomainXML bounds a domain definition: libvirt's own limit on one is
// 10 MiB; a VM's with a few dozen devices is tens of KiB.
const maxDomainXML = 4 << 20

func (s *Service) outgoingDomainXML(c *call, id, device string, options map[string]dbus.Variant) (string, string, error) {
	ctx, end, err := c.begin(newOpts(c.member, options))
	if err != nil {
		return "", "", err
	}
	defer end()
	x, err := s.m.OutgoingDomainXML(ctx, id, device)
	if err != nil {
		return "", "", cancelled(ctx, err)
	}
	return x.Persistent, x.Live, nil
}

func (s *Service) defineIncomingDomain(c *call, id, xml string, options map[string]dbus.Variant) error {
	ctx, end, err := c.begin(newOpts(c.member, options))
	if err != nil {
		return err
	}
	defer end()
	err = s.m.DefineIncomingDomain(ctx, id, xml)
	s.sync()
	return cancelled(ctx, err)
}

func (s *Service) undefineIncomingDomain(c *call, id string, options map[string]dbus.Variant) error {
	ctx, end, err := c.begin(newOpts(c.member, options))
	if err != nil {
		return err
	}
	defer end()
	err = s.m.UndefineIncomingDomain(ctx, id)
	s.sync()
	return cancelled(ctx, err)
}

func (s *Service) undefineOutgoingDomain(c *call, id string, options map[string]dbus.Variant) error {
	ctx, end, err := c.begin(newOpts(c.member, options))
	if err != nil {
		return err
	}
	defer end()
	err = s.m.UndefineOutgoingDomain(ctx, id)
	s.sync()
	return cancelled(ctx, err)
}
