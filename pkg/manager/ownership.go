package manager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/store"
)

// vgpud owns a device because it recorded creating it, never because a
// device on the host looks like one it would have made: an mdev keeps
// the UUID its creator gave it, so a caller choosing an instance UUID can
// name another tool's mdev (mdevctl's, say), with the very parent and
// type a create would pick. Such a device is refused at admission, a
// create that meets it on the host fails without taking it away, and
// after a crash or a timeout an mdev with a record's UUID counts as the
// record's only when the create's intent says vgpud wrote its create
// (stepMdevWrite) and the kernel did not answer that it existed already.

// instanceUUID is a caller's instance UUID in its one canonical form
// (lower case, dashed). The nil UUID is refused: it names no instance,
// and as an mdev's it is the value tools print for "none".
func instanceUUID(s string) (string, error) {
	u, err := uuid.Parse(s)
	if err != nil {
		return "", fail(ErrInvalidArgument, err, "instance UUID %s is not a UUID", QuoteArg(s))
	}
	if u == uuid.Nil {
		return "", fail(ErrInvalidArgument, nil, "instance UUID %s is the nil UUID, which names no instance; give another, or none to have one made", u)
	}
	return u.String(), nil
}

// refuseForeignUUID refuses an instance UUID that names an mdev on the
// host no record of vgpud's explains. A UUID a record holds is the
// admission's to judge (a retry returns the instance). A host that cannot
// be read now is not refused here: the create's own check refuses the
// mdev if it is there.
func (m *Manager) refuseForeignUUID(ctx context.Context, id string) error {
	if m.instanceExists(id) {
		return nil
	}
	md, err := sysfsRead(ctx, m, func() (gpu.Mdev, error) { return m.vgpu.Mdev(id) })
	if err != nil {
		return nil
	}
	return foreignUUIDError(id, md, m.mdevctlNote(md))
}

func foreignUUIDError(id string, md gpu.Mdev, note string) error {
	return fail(ErrConflict, nil, "instance UUID %s is taken: an mdev vgpud did not create has it, on %s as nvidia-%d%s; vgpud never takes over another's device: give another UUID, or remove that mdev first (mdevctl stop -u %s; mdevctl undefine -u %s if mdevctl defines it)",
		id, md.Parent, md.Type, note, id, id)
}

// mdevctlNote says, for a message, that mdevctl defines md (from the
// inventory, which read mdevctl's directory).
func (m *Manager) mdevctlNote(md gpu.Mdev) string {
	inv := m.Inventory()
	for i := range inv.GPUs {
		if x := mdevOf(&inv.GPUs[i], md.UUID); x != nil && x.Mdevctl != nil {
			return fmt.Sprintf(", defined by mdevctl (start %s)", x.Mdevctl.Start)
		}
	}
	return ""
}

// createMdev makes a record's mdev. One that exists already is not made
// by this call, so it is refused (gpu.ErrExists) before the intent
// records the write (save(stepMdevWrite)): only an mdev vgpud may have
// written is ever taken for the record's.
func (m *Manager) createMdev(ctx context.Context, rec *store.Instance, save func(carveStep) error) error {
	id := rec.MdevUUID
	if md, err := sysfsRead(ctx, m, func() (gpu.Mdev, error) { return m.vgpu.Mdev(id) }); err == nil {
		return fmt.Errorf("create mdev %s: it exists on %s as nvidia-%d: %w", id, md.Parent, md.Type, gpu.ErrExists)
	}
	if err := save(stepMdevWrite); err != nil {
		return err
	}
	return m.createVGPU(ctx, rec)
}

// mdevMayBeOurs says whether an mdev the host shows with a record's UUID,
// parent and type may be the one a create wrote: its intent recorded the
// write (steps), and the write did not fail because the mdev existed
// already (cause). Records of other flows have no such question.
func mdevMayBeOurs(rec *store.Instance, written bool, cause error) bool {
	if rec.Flow != store.FlowMdev {
		return true
	}
	return written && !errors.Is(cause, gpu.ErrExists)
}

// intentWrote: the intent's steps say vgpud wrote the record's vGPU (or
// began to: stepMdevWrite).
func intentWrote(it store.Intent) bool {
	return slices.Contains(it.Steps, string(stepMdevWrite)) || slices.Contains(it.Steps, string(stepVGPU))
}

// sameMdev: host mdev md is the one record r describes (UUID, parent and
// type), not another with its UUID.
func sameMdev(md *gpu.Mdev, r *store.Instance) bool {
	return strings.EqualFold(md.UUID, r.MdevUUID) && md.Parent == r.MdevParent && md.Type == r.TypeID
}
