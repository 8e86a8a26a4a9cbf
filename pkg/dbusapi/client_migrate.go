package dbusapi

import (
	"context"

	"github.com/godbus/dbus/v5"
)

// The client's half of moving a VM with its vGPU between two vgpud hosts
// (docs/operations.md, "Moving VMs"): one Client per host, the source's
// MigrationSource answer handed to the destination's PrepareIncoming.

// Incoming is the destination's answer to PrepareIncoming.
type Incoming struct {
	// Instance is the instance's UUID (the source instance's).
	Instance string `json:"instance"`
	Object   string `json:"object"`
	// Device is what the VM's hostdev must name on the destination: the
	// mdev's UUID, or the VF's PCI address.
	Device string `json:"device"`
	// VMCompatibility and CompatibilityLimit are the driver's answer
	// (nvmlVgpuPgpuCompatibility_t) for the GPU the instance is on.
	VMCompatibility    uint32 `json:"vmCompatibility"`
	CompatibilityLimit uint32 `json:"compatibilityLimit"`
}

// MigrationSource starts moving the VM of instance id away and returns the
// migration metadata (a JSON document) for the destination.
func (c *Client) MigrationSource(ctx context.Context, id string) (string, error) {
	var md string
	err := c.long(ctx, "start moving the VM of "+id, "MigrationSource", []any{id}, nil, &md)
	return md, err
}

// PrepareIncoming carves, on this host, the instance for a VM moving in
// with the source's metadata; vm and tenant "" are the source's.
func (c *Client) PrepareIncoming(ctx context.Context, metadata, vm, tenant string) (Incoming, error) {
	var in Incoming
	var path dbus.ObjectPath
	err := c.long(ctx, "prepare for a VM moving in", "PrepareIncoming", []any{metadata, vm, tenant}, nil,
		&path, &in.Instance, &in.Device, &in.VMCompatibility, &in.CompatibilityLimit)
	in.Object = string(path)
	return in, err
}

// CommitIncoming records that the VM arrived with instance id.
func (c *Client) CommitIncoming(ctx context.Context, id string) (Attachment, error) {
	var a Attachment
	err := c.long(ctx, "commit the VM moving in with "+id, "CommitIncoming", []any{id}, nil, &a.VMUUID, &a.Live)
	return a, err
}

// AbortIncoming releases instance id, prepared for a VM that did not come.
func (c *Client) AbortIncoming(ctx context.Context, id string) error {
	return c.long(ctx, "abort the VM moving in with "+id, "AbortIncoming", []any{id}, nil)
}

// CompleteOutgoing releases instance id, whose VM moved away.
func (c *Client) CompleteOutgoing(ctx context.Context, id string) error {
	return c.long(ctx, "complete the move of the VM of "+id, "CompleteOutgoing", []any{id}, nil)
}

// CancelOutgoing ends the move of the VM of instance id, which stayed.
func (c *Client) CancelOutgoing(ctx context.Context, id string) error {
	return c.long(ctx, "cancel the move of the VM of "+id, "CancelOutgoing", []any{id}, nil)
}

// OutgoingDomainXML returns the moving VM's persistent and live
// definitions rewritten to name device, the destination's.
func (c *Client) OutgoingDomainXML(ctx context.Context, id, device string) (persistent, live string, err error) {
	err = c.long(ctx, "rewrite the VM of "+id+" for the destination", "OutgoingDomainXML", []any{id, device}, nil, &persistent, &live)
	return persistent, live, err
}

// DefineIncomingDomain defines on this host the shut-off VM moving in
// with instance id.
func (c *Client) DefineIncomingDomain(ctx context.Context, id, xml string) error {
	return c.long(ctx, "define the VM moving in with "+id, "DefineIncomingDomain", []any{id, xml}, nil)
}

// UndefineIncomingDomain undefines on this host the shut-off VM
// DefineIncomingDomain defined for instance id, to give the move up.
func (c *Client) UndefineIncomingDomain(ctx context.Context, id string) error {
	return c.long(ctx, "give back the definition of the VM moving in with "+id, "UndefineIncomingDomain", []any{id}, nil)
}

// UndefineOutgoingDomain undefines on this host the shut-off VM of
// instance id, which moved away.
func (c *Client) UndefineOutgoingDomain(ctx context.Context, id string) error {
	return c.long(ctx, "undefine the VM of "+id+" that moved away", "UndefineOutgoingDomain", []any{id}, nil)
}

// HostVersions is what one end of a live move runs, as
// "major.minor.micro" strings.
type HostVersions struct {
	Host    string `json:"host"`
	Libvirt string `json:"libvirt"`
	QEMU    string `json:"qemu"`
	Kernel  string `json:"kernel"`
}

// MigrationTarget reports this (the destination) host's versions.
func (c *Client) MigrationTarget(ctx context.Context) (HostVersions, error) {
	var v HostVersions
	err := c.long(ctx, "read the destination's versions", "MigrationTarget", nil, nil, &v.Host, &v.Libvirt, &v.QEMU, &v.Kernel)
	return v, err
}

// PrecheckOutgoingLive asks the source whether the VM of instance id may
// move live to a destination running dst.
func (c *Client) PrecheckOutgoingLive(ctx context.Context, id string, dst HostVersions) error {
	return c.long(ctx, "check the live move of the VM of "+id, "PrecheckOutgoingLive", []any{id, dst.Host, dst.Libvirt, dst.QEMU, dst.Kernel}, nil)
}

// MigrateOutgoingLive moves the running VM of instance id to the
// destination at destURI, its vGPU there device.
func (c *Client) MigrateOutgoingLive(ctx context.Context, id, device, destURI, migrateURI string, dst HostVersions, keepSource bool) error {
	return c.long(ctx, "move the VM of "+id+" live", "MigrateOutgoingLive",
		[]any{id, device, destURI, migrateURI, dst.Host, dst.Libvirt, dst.QEMU, dst.Kernel, keepSource}, nil)
}
