// Package virt is vgpud's libvirt layer: a connection to libvirtd (over
// go-libvirt's pure-Go RPC) that reconnects with backoff, the hostdev XML for
// mdev vGPUs, vendor-VFIO VFs and passed-through GPUs (built with
// libvirt.org/go/libvirtxml, never by formatting strings), attach and detach
// to a domain's persistent config and live definition, the vgpud element in
// the domain's metadata that records which instances vgpud attached, and the
// domain lifecycle events.
//
// It owns no policy: the manager decides what to attach where and what to do
// with events. pkg/manager, the daemon's wiring and tests import it.
//
// Imports: internal/hostcall.
package virt
