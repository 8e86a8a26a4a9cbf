package dbusapi

import (
	"github.com/godbus/dbus/v5"
)

// domainEntry is one libvirt domain as ListDomains reports it.
type domainEntry struct {
	Name, UUID, State string
}

// Domain states ListDomains reports: libvirt's active domains (running,
// paused, anything holding a QEMU process) and the others.
const (
	DomainRunning = "running"
	DomainShutOff = "shut off"
)

// listDomains lists the VMs of the host's libvirt, for a client's VM
// chooser (the Cockpit page's Attach). The caller's timeout bounds it.
func (s *Service) listDomains(c *call, options map[string]dbus.Variant) ([]domainEntry, error) {
	o := newOpts(c.member, options)
	ctx, end, err := c.begin(o)
	if err != nil {
		return nil, err
	}
	defer end()
	ds, err := s.m.Domains(ctx)
	if err != nil {
		return nil, err
	}
	out := []domainEntry{}
	for _, d := range ds {
		st := DomainShutOff
		if d.Running {
			st = DomainRunning
		}
		out = append(out, domainEntry{Name: d.Name, UUID: d.UUID, State: st})
	}
	return out, nil
}
