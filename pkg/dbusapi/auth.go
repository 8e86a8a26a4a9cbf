package dbusapi

import (
	"context"
	"errors"
	"fmt"
	"os/user"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/vgpud/vgpud/pkg/manager"
)

// Caller is who sent a method call, as the bus reports it.
type Caller struct {
	UID uint32
	// GIDs are the caller's groups: from the bus when it reports them
	// (GetConnectionCredentials' UnixGroupIDs), else from the user database.
	GIDs []uint32
}

// credCache keeps each connection's credentials: a unique bus name is
// never reused while the bus runs and its uid cannot change, so an entry
// stays valid until the connection leaves the bus.
type credCache struct {
	mu sync.Mutex
	m  map[string]Caller
}

// credCacheMax bounds the cache; past it the cache starts over (entries of
// connections that left are normally dropped on NameOwnerChanged).
const credCacheMax = 4096

func newCredCache() *credCache { return &credCache{m: map[string]Caller{}} }

func (c *credCache) get(sender string) (Caller, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cr, ok := c.m[sender]
	return cr, ok
}

func (c *credCache) put(sender string, cr Caller) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= credCacheMax {
		c.m = map[string]Caller{}
	}
	c.m[sender] = cr
}

func (c *credCache) forget(sender string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, sender)
}

// busCredentials asks the bus who a connection is: its uid with
// GetConnectionUnixUser, its groups with GetConnectionCredentials.
func (s *Service) busCredentials(ctx context.Context, sender string) (Caller, error) {
	var uid uint32
	bus := s.conn.BusObject()
	if err := bus.CallWithContext(ctx, "org.freedesktop.DBus.GetConnectionUnixUser", 0, sender).Store(&uid); err != nil {
		return Caller{}, fmt.Errorf("GetConnectionUnixUser %s: %w", sender, err)
	}
	cr := Caller{UID: uid}
	if uid == 0 {
		return cr, nil
	}
	var creds map[string]dbus.Variant
	if err := bus.CallWithContext(ctx, "org.freedesktop.DBus.GetConnectionCredentials", 0, sender).Store(&creds); err == nil {
		if v, ok := creds["UnixGroupIDs"]; ok {
			if gids, ok := v.Value().([]uint32); ok {
				cr.GIDs = gids
				return cr, nil
			}
		}
	}
	// The bus does not report groups: take the user database's.
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
		if ids, err := u.GroupIds(); err == nil {
			for _, id := range ids {
				if g, err := strconv.ParseUint(id, 10, 32); err == nil {
					cr.GIDs = append(cr.GIDs, uint32(g))
				}
			}
		}
	}
	return cr, nil
}

func (s *Service) caller(ctx context.Context, sender string) (Caller, error) {
	if cr, ok := s.creds.get(sender); ok {
		return cr, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cr, err := s.credentials(cctx, sender)
	if err != nil {
		return Caller{}, err
	}
	s.creds.put(sender, cr)
	return cr, nil
}

// groupID looks the vgpud group up each time: a group created after the
// daemon started (package install) counts at once.
func (s *Service) groupID() (uint32, bool) {
	g, err := user.LookupGroup(s.opts.Group)
	if err != nil {
		return 0, false
	}
	id, err := strconv.ParseUint(g.Gid, 10, 32)
	if err != nil {
		return 0, false
	}
	return uint32(id), true
}

// decision is the authorization policy, kept free of I/O so it can be
// tested as a table: root always; group vgpud for reads, and for changes
// unless groupReads (the setting groupAccess: read) leaves those to
// polkit; polkit's verdict for changes by anyone else, when polkit is
// asked.
func decision(cr Caller, a access, group uint32, haveGroup, groupReads bool, polkit func() (bool, error)) (bool, error) {
	member := haveGroup && slices.Contains(cr.GIDs, group)
	switch {
	case a == accessPublic || cr.UID == 0:
		return true, nil
	case member && (a == accessRead || !groupReads):
		return true, nil
	case a == accessManage && polkit != nil:
		return polkit()
	}
	return false, nil
}

// may reports whether the call's sender may do what a needs. interactive
// is whether polkit may ask the caller for a password.
func (c *call) may(a access, interactive bool) (bool, Caller, error) {
	if a == accessPublic {
		return true, Caller{}, nil
	}
	cr, err := c.svc.caller(c.ctx, c.sender)
	if err != nil {
		return false, cr, err
	}
	gid, haveGroup := c.svc.groupID()
	var pk func() (bool, error)
	if !c.svc.opts.NoPolkit {
		pk = func() (bool, error) {
			ok, err := c.svc.polkit(c.ctx, c.sender, interactive)
			if err != nil {
				// A broken polkitd must not lock root and group vgpud out,
				// and it grants nothing.
				c.svc.log.Warn("polkit check failed; denying", "method", c.member, "uid", cr.UID, "err", err)
				return false, nil
			}
			return ok, nil
		}
	}
	ok, err := decision(cr, a, gid, haveGroup, c.svc.opts.GroupReadOnly, pk)
	return ok, cr, err
}

// require authorizes the call and records the caller on it; a refusal is
// logged with the uid and the method and answered with
// dev.vgpud1.Error.AccessDenied.
func (c *call) require(a access) error {
	ok, cr, err := c.may(a, c.interactive)
	if err != nil {
		// The bus did not say who the caller is, so there is no uid to log.
		c.svc.log.Warn("access denied", "uid", "unknown", "method", c.member, "path", string(c.path), "sender", c.sender, "needs", a.String(), "err", err)
		return apiErr(manager.ErrAccessDenied, "vgpud could not identify the caller; retry (vgpud's log has the cause)")
	}
	if ok {
		c.caller = cr
		return nil
	}
	c.svc.log.Warn("access denied", "uid", cr.UID, "method", c.member, "path", string(c.path), "sender", c.sender, "needs", a.String())
	return apiErr(manager.ErrAccessDenied, "%s", c.svc.refusal(a, cr))
}

// refusal says why cr may not do what a needs, and what to ask for.
func (s *Service) refusal(a access, cr Caller) string {
	g := s.opts.Group
	if a == accessRead {
		return fmt.Sprintf("reading vgpud's state needs root or membership in group %s; uid %d has neither. Ask an administrator to add you (usermod -aG %s USER)", g, cr.UID, g)
	}
	if s.opts.GroupReadOnly {
		return fmt.Sprintf("changing vgpud's state needs root or polkit's authorization %s (group %s may only read on this host: groupAccess is read); uid %d has neither. Ask an administrator for the authorization, or use Cockpit's administrative access", PolkitAction, g, cr.UID)
	}
	return fmt.Sprintf("changing vgpud's state needs root, membership in group %s or polkit's authorization %s; uid %d has none of them. Ask an administrator to add you (usermod -aG %s USER)", g, PolkitAction, cr.UID, g)
}

// Polkit's CheckAuthorization types.
type polkitSubject struct {
	Kind    string
	Details map[string]dbus.Variant
}

type polkitResult struct {
	IsAuthorized, IsChallenge bool
	Details                   map[string]string
}

const serviceUnknown = "org.freedesktop.DBus.Error.ServiceUnknown"

// busPolkit asks polkitd whether the sender may perform dev.vgpud1.manage.
// polkitd is bus-activated (Debian's polkit.service is started by its
// first caller), so the call may start it; on a host without polkit the
// bus answers ServiceUnknown at once, and only root and group vgpud may
// change state.
func (s *Service) busPolkit(ctx context.Context, sender string, interactive bool) (bool, error) {
	flags := uint32(0)
	if interactive {
		flags = 1 // AllowUserInteraction
	}
	subject := polkitSubject{Kind: "system-bus-name", Details: map[string]dbus.Variant{"name": dbus.MakeVariant(sender)}}
	var res polkitResult
	obj := s.conn.Object("org.freedesktop.PolicyKit1", "/org/freedesktop/PolicyKit1/Authority")
	err := obj.CallWithContext(ctx, "org.freedesktop.PolicyKit1.Authority.CheckAuthorization", 0,
		subject, PolkitAction, map[string]string{}, flags, "").Store(&res)
	var de dbus.Error
	var dep *dbus.Error
	if (errors.As(err, &de) && de.Name == serviceUnknown) || (errors.As(err, &dep) && dep.Name == serviceUnknown) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("polkit CheckAuthorization: %w", err)
	}
	return res.IsAuthorized, nil
}
