package dbusapi

import (
	"github.com/vgpud/vgpud/pkg/manager"
)

// getAccess tells the caller what vgpud lets it do, and why not, so that a
// client (the Cockpit page) draws a read-only view with the reason instead
// of learning it from a refused change. polkit is asked without
// interaction: asking what one may do never prompts for a password.
func (s *Service) getAccess(c *call) (canRead, canManage bool, reason string, err error) {
	canRead, cr, err := c.may(accessRead, false)
	if err != nil {
		s.log.Warn("access query: caller unknown", "sender", c.sender, "err", err)
		return false, false, "", apiErr(manager.ErrAccessDenied, "vgpud could not identify the caller; retry (vgpud's log has the cause)")
	}
	canManage, _, err = c.may(accessManage, false)
	if err != nil {
		return false, false, "", apiErr(manager.ErrAccessDenied, "vgpud could not identify the caller; retry (vgpud's log has the cause)")
	}
	switch {
	case !canRead:
		reason = s.refusal(accessRead, cr)
	case !canManage:
		reason = s.refusal(accessManage, cr)
	}
	return canRead, canManage, reason, nil
}
