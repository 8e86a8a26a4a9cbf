package dbusapi

import (
	"context"
	"errors"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// Options every long operation takes in its a{sv} argument.
const (
	// OptTimeout (t, milliseconds) is the caller's timeout: the operation
	// is cancelled, and what it did undone, when it passes. The client sets
	// it from its context's deadline.
	OptTimeout = "timeout-ms"
	// OptOperationID (s) names the operation so that Cancel can stop it.
	OptOperationID = "operation-id"
	// OptPlacementConsumer (s) is CreateInstance's fleet option: the
	// consumer UUID of the Placement allocation to honour.
	OptPlacementConsumer = "placement-consumer"
)

// opts reads a method's a{sv} options strictly: an unknown key or a value
// of the wrong type is InvalidArgument, so a misspelt option is not
// silently ignored.
type opts struct {
	member string
	m      map[string]dbus.Variant
	known  []string
	err    error
}

func newOpts(member string, m map[string]dbus.Variant) *opts {
	return &opts{member: member, m: m, known: []string{OptTimeout, OptOperationID}}
}

func (o *opts) bad(key, want string, v dbus.Variant) {
	if o.err == nil {
		o.err = invalidArg("%s: option %q must be of type %s, got %s", o.member, key, want, v.Signature())
	}
}

// str reads a string option; "" when it is absent. A given option must
// say something: an empty or blank value is refused, never read as "not
// given" (which may mean "any").
func (o *opts) str(key string) string {
	o.known = append(o.known, key)
	v, ok := o.m[key]
	if !ok {
		return ""
	}
	s, ok := v.Value().(string)
	if !ok {
		o.bad(key, "s", v)
		return ""
	}
	if strings.TrimSpace(s) == "" && o.err == nil {
		o.err = invalidArg("%s: option %q is empty; give a value or leave the option out", o.member, key)
	}
	return s
}

func (o *opts) boolean(key string) bool {
	o.known = append(o.known, key)
	v, ok := o.m[key]
	if !ok {
		return false
	}
	b, ok := v.Value().(bool)
	if !ok {
		o.bad(key, "b", v)
	}
	return b
}

func (o *opts) strings(key string) []string {
	o.known = append(o.known, key)
	v, ok := o.m[key]
	if !ok {
		return nil
	}
	s, ok := v.Value().([]string)
	if !ok {
		o.bad(key, "as", v)
		return nil
	}
	if len(s) == 0 && o.err == nil {
		o.err = invalidArg("%s: option %q is an empty list; give at least one value or leave the option out", o.member, key)
	}
	return s
}

// Quota names the unlimited option takes.
const (
	QuotaVRAM      = "vram"
	QuotaCompute   = "compute"
	QuotaInstances = "instances"
)

// quota is a tenant quota from DefineTenant's and SetQuota's arguments,
// with the quotas the unlimited option names made unlimited: Cockpit's
// bridge sends JSON numbers as int64, so it cannot send UINT64_MAX, and
// a client there names what it wants unlimited instead. An unknown name
// is InvalidArgument.
func (o *opts) quota(vram, compute, instances uint64) tenant.Quota {
	q := tenant.Quota{VRAMBytes: vram, ComputeMilli: compute, MaxInstances: instances}
	for _, n := range o.strings("unlimited") {
		switch n {
		case QuotaVRAM:
			q.VRAMBytes = tenant.Unlimited
		case QuotaCompute:
			q.ComputeMilli = tenant.Unlimited
		case QuotaInstances:
			q.MaxInstances = tenant.Unlimited
		default:
			if o.err == nil {
				o.err = invalidArg("%s: option \"unlimited\": %s is not a quota; give %s, %s or %s", o.member, manager.QuoteArg(n), QuotaVRAM, QuotaCompute, QuotaInstances)
			}
		}
	}
	return q
}

// unsigned accepts any unsigned or non-negative integer type: busctl and
// other clients pick different ones.
func (o *opts) unsigned(key string) (uint64, bool) {
	v, ok := o.m[key]
	if !ok {
		return 0, false
	}
	switch x := v.Value().(type) {
	case uint64:
		return x, true
	case uint32:
		return uint64(x), true
	case uint16:
		return uint64(x), true
	case byte:
		return uint64(x), true
	case int64:
		if x >= 0 {
			return uint64(x), true
		}
	case int32:
		if x >= 0 {
			return uint64(x), true
		}
	case int16:
		if x >= 0 {
			return uint64(x), true
		}
	}
	o.bad(key, "t", v)
	return 0, false
}

// check reports an option of the wrong type or an unknown one.
func (o *opts) check() error {
	if o.err != nil {
		return o.err
	}
	for k := range o.m {
		if !slices.Contains(o.known, k) {
			// Options are read more than once (begin reads the operation
			// id again): list each name once.
			known := slices.Clone(o.known)
			sort.Strings(known)
			return invalidArg("%s: unknown option %s (known: %s)", o.member, manager.QuoteArg(k), strings.Join(slices.Compact(known), ", "))
		}
	}
	return nil
}

// op is one long operation in flight.
type op struct {
	id, sender, member string
	uid                uint32
	cancel             context.CancelFunc
	// stop cancels it because the daemon is stopping (errStopping is the
	// context's cause), so the reply says so.
	stop func()
}

// errStopping is the cause of the contexts of operations cancelled because
// the daemon stops.
var errStopping = errors.New("vgpud is stopping")

// opTracker holds the operations in flight, by id and by caller, so that
// Cancel can stop one and a caller that leaves the bus stops its own.
type opTracker struct {
	mu       sync.Mutex
	byID     map[string]*op
	bySender map[string]map[*op]struct{}
}

func newOpTracker() *opTracker {
	return &opTracker{byID: map[string]*op{}, bySender: map[string]map[*op]struct{}{}}
}

func (t *opTracker) add(o *op) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o.id != "" {
		if _, ok := t.byID[o.id]; ok {
			return apiErr(manager.ErrConflict, "operation id %q is in use by an operation in flight; use a fresh id", o.id)
		}
		t.byID[o.id] = o
	}
	s := t.bySender[o.sender]
	if s == nil {
		s = map[*op]struct{}{}
		t.bySender[o.sender] = s
	}
	s[o] = struct{}{}
	return nil
}

func (t *opTracker) remove(o *op) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o.id != "" && t.byID[o.id] == o {
		delete(t.byID, o.id)
	}
	if s := t.bySender[o.sender]; s != nil {
		delete(s, o)
		if len(s) == 0 {
			delete(t.bySender, o.sender)
		}
	}
}

// cancelID cancels the operation with that id if the caller may: the uid
// that started it, or root.
func (t *opTracker) cancelID(id string, uid uint32) (string, error) {
	t.mu.Lock()
	o := t.byID[id]
	t.mu.Unlock()
	if o == nil {
		return "", apiErr(manager.ErrNotFound, "no operation %q in flight (it may have finished already)", id)
	}
	if uid != 0 && uid != o.uid {
		// An apiError, not yet a D-Bus error: Cancel logs the denial by its sentinel.
		return "", &apiError{kind: manager.ErrAccessDenied, msg: "operation " + strconv.Quote(id) + " was started by another user; only that user or root may cancel it"}
	}
	o.cancel()
	return o.member, nil
}

// cancelSender cancels everything a caller that left the bus started.
func (t *opTracker) cancelSender(sender string) int {
	t.mu.Lock()
	var list []*op
	for o := range t.bySender[sender] {
		list = append(list, o)
	}
	t.mu.Unlock()
	for _, o := range list {
		o.cancel()
	}
	return len(list)
}

// begin starts a long operation for c: a context that ends at the caller's
// timeout (capped by MaxTimeout; DefaultTimeout when none is given), when
// Cancel names its id, when the caller leaves the bus, or when the daemon
// stops. end must be called when the operation returns.
func (c *call) begin(o *opts) (ctx context.Context, end func(), err error) {
	id := o.str(OptOperationID)
	timeout := c.svc.opts.DefaultTimeout
	if ms, ok := o.unsigned(OptTimeout); ok {
		if ms == 0 {
			return nil, nil, invalidArg("%s: option %q must be positive", c.member, OptTimeout)
		}
		if ms > uint64(c.svc.opts.MaxTimeout/time.Millisecond) {
			timeout = c.svc.opts.MaxTimeout
		} else {
			timeout = time.Duration(ms) * time.Millisecond
		}
	}
	if err := o.check(); err != nil {
		return nil, nil, err
	}
	base, cancelCause := context.WithCancelCause(c.ctx)
	ctx, cancelTimeout := context.WithTimeout(base, timeout)
	cancel := func() { cancelTimeout(); cancelCause(nil) }
	// The uid is the one authorization checked, not a cache look-up that
	// could miss (and read as root) if the cache started over meanwhile.
	cur := &op{id: id, sender: c.sender, member: c.member, uid: c.caller.UID, cancel: cancel,
		stop: func() { cancelCause(errStopping) }}
	if err := c.svc.ops.add(cur); err != nil {
		cancel()
		return nil, nil, err
	}
	return ctx, func() { c.svc.ops.remove(cur); cancel() }, nil
}
