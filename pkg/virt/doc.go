// Package virt is vgpud's libvirt layer: a connection to libvirtd (over
// go-libvirt's pure-Go RPC) that reconnects with backoff, the hostdev XML for
// mdev vGPUs, vendor-VFIO VFs and passed-through GPUs (built with
// libvirt.org/go/libvirtxml, never by formatting strings), attach and detach
// to a domain's persistent config and live definition, the vgpud element in
// the domain's metadata that records which instances vgpud attached, the
// domain lifecycle events, and moving a domain to another host: its
// definition with the vGPU rewritten for the destination, offline by
// define and undefine, live by peer-to-peer migration once both ends'
// versions allow it (docs/operations.md, "Moving VMs").
//
// It owns no policy: the manager decides what to attach where and what to do
// with events. pkg/manager, the daemon's wiring and tests import it.
//
// Imports: internal/hostcall.
package virt
