package dbusapi

import (
	"encoding/xml"
	"strings"

	"github.com/godbus/dbus/v5"
)

// ifaceDef is one interface: its documentation, methods, properties and
// signals. Introspection is generated from it, and calls are dispatched
// through it, so the two cannot disagree.
type ifaceDef struct {
	name    string
	doc     string
	methods []*methodDef
	props   []propDef
	signals []signalDef
}

type signalDef struct {
	name, doc string
	args      []arg
}

func (d *ifaceDef) method(name string) *methodDef {
	for _, m := range d.methods {
		if m.name == name {
			return m
		}
	}
	return nil
}

func (d *ifaceDef) prop(name string) (propDef, bool) {
	for _, p := range d.props {
		if p.name == name {
			return p, true
		}
	}
	return propDef{}, false
}

// objectIfaces lists the interfaces of each kind of object, in the order
// introspection shows them.
func objectIfaces(k objKind) []string {
	switch k {
	case kindManager:
		return []string{ManagerInterface, objectManagerInterface, propertiesInterface, introspectInterface, peerInterface}
	case kindGPU:
		return []string{GPUInterface, propertiesInterface, introspectInterface, peerInterface}
	case kindInstance:
		return []string{InstanceInterface, propertiesInterface, introspectInterface, peerInterface}
	case kindTenant:
		return []string{TenantInterface, propertiesInterface, introspectInterface, peerInterface}
	case kindRoot, kindDir:
		return []string{introspectInterface, peerInterface}
	}
	return nil
}

// LookupObject implements dbus.Handler: every path the API defines has an
// object, including ids no object has (those answer NotFound to callers
// who may read, after authorization).
func (s *Service) LookupObject(path dbus.ObjectPath) (dbus.ServerObject, bool) {
	kind, _ := parsePath(path)
	if kind == kindNone {
		return nil, false
	}
	return serverObject{s: s, kind: kind}, true
}

type serverObject struct {
	s    *Service
	kind objKind
}

func (o serverObject) LookupInterface(name string) (dbus.Interface, bool) {
	ifaces := objectIfaces(o.kind)
	if name == "" {
		// A call without an interface: the first interface with the member.
		return anyIface{s: o.s, names: ifaces}, true
	}
	for _, n := range ifaces {
		if n == name {
			if d := o.s.ifaces[n]; d != nil {
				return serverIface{s: o.s, def: d}, true
			}
		}
	}
	return nil, false
}

type serverIface struct {
	s   *Service
	def *ifaceDef
}

func (i serverIface) LookupMethod(name string) (dbus.Method, bool) {
	m := i.def.method(name)
	if m == nil || m.fn == nil {
		return nil, false
	}
	return boundMethod{def: m, svc: i.s, iface: i.def.name}, true
}

type anyIface struct {
	s     *Service
	names []string
}

func (a anyIface) LookupMethod(name string) (dbus.Method, bool) {
	for _, n := range a.names {
		if d := a.s.ifaces[n]; d != nil {
			if m, ok := (serverIface{s: a.s, def: d}).LookupMethod(name); ok {
				return m, true
			}
		}
	}
	return nil, false
}

// Introspection XML, with the annotations GDBus and d-feet read.
type xNode struct {
	XMLName    xml.Name `xml:"node"`
	Name       string   `xml:"name,attr,omitempty"`
	Interfaces []xIface `xml:"interface"`
	Children   []xChild `xml:"node"`
}

type xChild struct {
	Name string `xml:"name,attr"`
}

type xIface struct {
	Name    string    `xml:"name,attr"`
	Methods []xMethod `xml:"method"`
	Signals []xSignal `xml:"signal"`
	Props   []xProp   `xml:"property"`
	Annots  []xAnnot  `xml:"annotation"`
}

type xMethod struct {
	Name   string   `xml:"name,attr"`
	Args   []xArg   `xml:"arg"`
	Annots []xAnnot `xml:"annotation"`
}

type xSignal struct {
	Name   string   `xml:"name,attr"`
	Args   []xArg   `xml:"arg"`
	Annots []xAnnot `xml:"annotation"`
}

type xArg struct {
	Name      string   `xml:"name,attr"`
	Type      string   `xml:"type,attr"`
	Direction string   `xml:"direction,attr,omitempty"`
	Annots    []xAnnot `xml:"annotation"`
}

type xProp struct {
	Name   string   `xml:"name,attr"`
	Type   string   `xml:"type,attr"`
	Access string   `xml:"access,attr"`
	Annots []xAnnot `xml:"annotation"`
}

type xAnnot struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

const docAnnotation = "org.gtk.GDBus.DocString"

func docs(doc string) []xAnnot {
	if doc == "" {
		return nil
	}
	return []xAnnot{{Name: docAnnotation, Value: doc}}
}

func (d *ifaceDef) xml() xIface {
	x := xIface{Name: d.name, Annots: docs(d.doc)}
	if len(d.props) > 0 {
		x.Annots = append(x.Annots, xAnnot{Name: "org.freedesktop.DBus.Property.EmitsChangedSignal", Value: "true"})
	}
	for _, m := range d.methods {
		xm := xMethod{Name: m.name, Annots: docs(m.doc)}
		if m.access != accessPublic {
			xm.Annots = append(xm.Annots, xAnnot{Name: "dev.vgpud1.Access", Value: m.accessDoc()})
		}
		for i, a := range m.in {
			xm.Args = append(xm.Args, xArg{Name: a.name, Type: m.sigIn(i), Direction: "in", Annots: docs(a.doc)})
		}
		for i, a := range m.out {
			xm.Args = append(xm.Args, xArg{Name: a.name, Type: m.sigOut(i), Direction: "out", Annots: docs(a.doc)})
		}
		x.Methods = append(x.Methods, xm)
	}
	for _, sg := range d.signals {
		xs := xSignal{Name: sg.name, Annots: docs(sg.doc)}
		for _, a := range sg.args {
			xs.Args = append(xs.Args, xArg{Name: a.name, Type: a.sig, Annots: docs(a.doc)})
		}
		x.Signals = append(x.Signals, xs)
	}
	for _, p := range d.props {
		x.Props = append(x.Props, xProp{Name: p.name, Type: p.sig, Access: "read", Annots: docs(p.doc)})
	}
	return x
}

func (m *methodDef) sigIn(i int) string {
	if i < len(m.inSigs) {
		return m.inSigs[i]
	}
	return m.in[i].sig
}

func (m *methodDef) sigOut(i int) string {
	if i < len(m.outSigs) {
		return m.outSigs[i]
	}
	return m.out[i].sig
}

// introspect renders the XML of a path; children are listed only when
// withChildren (callers who may read: the names are GPU addresses,
// instance UUIDs and tenant names).
func (s *Service) introspect(path dbus.ObjectPath, kind objKind, withChildren bool) string {
	n := xNode{}
	for _, name := range objectIfaces(kind) {
		if d := s.ifaces[name]; d != nil {
			n.Interfaces = append(n.Interfaces, d.xml())
		}
	}
	switch kind {
	case kindRoot:
		if path == "/" {
			n.Children = []xChild{{Name: "dev"}}
		} else {
			n.Children = []xChild{{Name: "vgpud1"}}
		}
	case kindManager:
		n.Children = []xChild{{Name: "gpu"}, {Name: "instance"}, {Name: "tenant"}}
	case kindDir:
		if withChildren {
			for _, c := range s.current().children(path) {
				n.Children = append(n.Children, xChild{Name: c})
			}
		}
	}
	out, err := xml.MarshalIndent(n, "", " ")
	if err != nil {
		// Only reachable through a programming error in the structs above.
		return "<node/>"
	}
	return strings.TrimSpace(introspectHeader) + "\n" + string(out) + "\n"
}

const introspectHeader = `<!DOCTYPE node PUBLIC "-//freedesktop//DTD D-BUS Object Introspection 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd">`
