package dbusapi

import (
	"context"
	"fmt"
	"reflect"

	"github.com/godbus/dbus/v5"
)

// access is what a method needs of its caller.
type access int

const (
	// accessPublic: anyone (introspection, the version).
	accessPublic access = iota
	// accessRead: root and group vgpud.
	accessRead
	// accessManage: root, group vgpud, or polkit's dev.vgpud1.manage.
	accessManage
)

func (a access) String() string {
	switch a {
	case accessPublic:
		return "public"
	case accessRead:
		return "read"
	}
	return "manage"
}

// arg names one argument of a method or signal and says what it is.
type arg struct {
	name, doc string
	// sig is only set for signals (method argument types come from the
	// Go function).
	sig string
	// max bounds a string argument in bytes; 0 is maxName (see bounds.go).
	max int
}

// methodDef is one D-Bus method: its documentation, what it needs of the
// caller, and the Go function that implements it. fn is
// func(*call, in...) (out..., error); the D-Bus types of in and out are
// the Go types' (dbus.SignatureOfType), so the introspection data cannot
// disagree with what the method takes.
type methodDef struct {
	name   string
	doc    string
	access access
	// readIf, when set, lowers access to accessRead for calls whose
	// arguments only compute (a dry run): it gets the decoded arguments
	// without the *call. readIfDoc names that case for the documentation.
	readIf    func(args []any) bool
	readIfDoc string
	in        []arg
	out       []arg
	fn        any

	fnv     reflect.Value
	inT     []reflect.Type
	outT    []reflect.Type
	inSigs  []string
	outSigs []string
}

var (
	callType  = reflect.TypeOf((*call)(nil))
	errorType = reflect.TypeOf((*error)(nil)).Elem()
)

// bind checks fn against the declared arguments and records their types;
// a mismatch is a programming error, caught by the package's tests.
func (m *methodDef) bind(iface string) {
	t := reflect.TypeOf(m.fn)
	if t == nil || t.Kind() != reflect.Func || t.NumIn() < 1 || t.In(0) != callType ||
		t.NumOut() < 1 || t.Out(t.NumOut()-1) != errorType {
		panic(fmt.Sprintf("dbusapi: %s.%s: fn must be func(*call, ...) (..., error), is %v", iface, m.name, t))
	}
	if t.NumIn()-1 != len(m.in) || t.NumOut()-1 != len(m.out) {
		panic(fmt.Sprintf("dbusapi: %s.%s: %d in and %d out arguments declared, fn has %d and %d",
			iface, m.name, len(m.in), len(m.out), t.NumIn()-1, t.NumOut()-1))
	}
	m.fnv = reflect.ValueOf(m.fn)
	m.inT, m.outT, m.inSigs, m.outSigs = nil, nil, nil, nil
	for i := 1; i < t.NumIn(); i++ {
		m.inT = append(m.inT, t.In(i))
		m.inSigs = append(m.inSigs, dbus.SignatureOfType(t.In(i)).String())
	}
	for i := 0; i < t.NumOut()-1; i++ {
		m.outT = append(m.outT, t.Out(i))
		m.outSigs = append(m.outSigs, dbus.SignatureOfType(t.Out(i)).String())
	}
}

// call is one method call being served.
type call struct {
	svc    *Service
	ctx    context.Context
	sender string
	path   dbus.ObjectPath
	kind   objKind
	// id is the GPU PCI address, instance UUID or tenant name of the path.
	id string
	// member is "Interface.Method", for logs and denials.
	member      string
	interactive bool
	// caller is who authorization found the sender to be (the zero
	// Caller for public methods).
	caller Caller
}

// boundMethod is a methodDef serving calls on one connection; it
// implements godbus's Method and ArgumentDecoder.
type boundMethod struct {
	def   *methodDef
	svc   *Service
	iface string
}

func (b boundMethod) DecodeArguments(_ *dbus.Conn, sender string, msg *dbus.Message, body []any) ([]any, error) {
	path, _ := msg.Headers[dbus.FieldPath].Value().(dbus.ObjectPath)
	kind, id := parsePath(path)
	c := &call{
		svc: b.svc, ctx: b.svc.ctx, sender: sender, path: path, kind: kind, id: id,
		member:      b.iface + "." + b.def.name,
		interactive: msg.Flags&dbus.FlagAllowInteractiveAuthorization != 0,
	}
	if len(body) != len(b.def.inT) {
		return nil, invalidArg("%s takes %d arguments (%s), got %d", c.member, len(b.def.inT), joinSigs(b.def.inSigs), len(body))
	}
	ptrs := make([]any, len(b.def.inT))
	for i, t := range b.def.inT {
		ptrs[i] = reflect.New(t).Interface()
	}
	if err := dbus.Store(body, ptrs...); err != nil {
		return nil, invalidArg("%s takes (%s): %v", c.member, joinSigs(b.def.inSigs), err)
	}
	args := make([]any, 0, len(ptrs)+1)
	args = append(args, c)
	for _, p := range ptrs {
		args = append(args, reflect.ValueOf(p).Elem().Interface())
	}
	return args, nil
}

func (b boundMethod) Call(args ...any) ([]any, error) {
	// godbus sends the reply as soon as this returns; Close's own round
	// trip to the bus (ReleaseName) after the count drops covers that.
	b.svc.inFlight.Add(1)
	defer b.svc.inFlight.Add(-1)
	c, ok := args[0].(*call)
	if !ok {
		return nil, invalidArg("internal: call context missing")
	}
	if err := c.require(b.def.needs(args[1:])); err != nil {
		return nil, err
	}
	// Bounds after authorization: a caller without rights learns nothing
	// from which of its arguments would have been refused.
	if err := checkArgs(c.member, b.def, args[1:]); err != nil {
		return nil, err
	}
	in := make([]reflect.Value, len(args))
	for i, a := range args {
		if a == nil {
			in[i] = reflect.Zero(b.def.fnv.Type().In(i))
		} else {
			in[i] = reflect.ValueOf(a)
		}
	}
	outs := b.def.fnv.Call(in)
	if e := outs[len(outs)-1]; !e.IsNil() {
		return nil, b.svc.replyError(c, e.Interface().(error))
	}
	ret := make([]any, len(outs)-1)
	for i := range ret {
		ret[i] = outs[i].Interface()
	}
	return ret, nil
}

func (b boundMethod) NumArguments() int { return len(b.def.inT) + 1 }
func (b boundMethod) NumReturns() int   { return len(b.def.outT) }

func (b boundMethod) ArgumentValue(i int) any {
	if i == 0 {
		return (*call)(nil)
	}
	return reflect.Zero(b.def.inT[i-1]).Interface()
}

func (b boundMethod) ReturnValue(i int) any { return reflect.Zero(b.def.outT[i]).Interface() }

// needs is the access a call with these arguments needs.
func (m *methodDef) needs(args []any) access {
	if m.readIf != nil && m.readIf(args) {
		return accessRead
	}
	return m.access
}

// accessDoc is the access as documentation and introspection show it.
func (m *methodDef) accessDoc() string {
	if m.readIf != nil {
		return m.access.String() + "; read when " + m.readIfDoc
	}
	return m.access.String()
}

func joinSigs(s []string) string {
	out := ""
	for _, x := range s {
		out += x
	}
	return out
}
