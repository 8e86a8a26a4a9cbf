package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/google/uuid"
	"github.com/spf13/cobra"
)

// migrate run: the whole move of a shut-off VM with its vGPU, driving the
// source's vgpud (--connect) and the destination's (--to) in turn; each
// vgpud acts on its own libvirt (docs/operations.md, "Moving VMs").

// movedDoc is migrate run's JSON document.
type movedDoc struct {
	header
	Instance string `json:"instance"`
	VM       string `json:"vm"`
	To       string `json:"to"`
	// Device is what the VM's hostdev names on the destination.
	Device     string `json:"device"`
	KeepSource bool   `json:"keepSource"`
}

func (a *app) migrateRunCmd() *cobra.Command {
	var to, tenantName string
	var keep, live bool
	var destURI, migrateURI string
	cmd := &cobra.Command{
		Use:   "run INSTANCE|VM --to ADDRESS [--keep-source] [--live --dest-uri URI [--migrate-uri URI]]",
		Short: "Move the VM of an instance, with its vGPU, to the vgpud at --to (both hosts' parts and libvirt's)",
		Long: `Move the VM an instance is attached to (or the VM named, which holds one
vGPU), with its vGPU, from this host
(--connect) to the vgpud whose D-Bus address --to names: migrate source here,
migrate prepare there, the VM's definition rewritten here for the device
prepared there, defined there and undefined here (kept with --keep-source),
then migrate commit there and migrate complete here. When a step before the
VM is defined on both ends fails, the destination releases what it carved
and the VM stays here. With --live a running VM moves by libvirt's
peer-to-peer live migration, run by this host's vgpud: the versions of both
ends are checked first (a running vGPU needs QEMU 8.1, libvirt 8.6 and
kernel 5.18 on both), before anything is carved on the destination.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeInstances,
		RunE: a.withAPI(func(ctx context.Context, src api, cmd *cobra.Command, args []string) error {
			if to == "" {
				return usagef("migrate run: --to names the destination vgpud's D-Bus address (unix:path=..., or a socket forwarded over SSH)")
			}
			if live && destURI == "" {
				return usagef("migrate run --live: --dest-uri names the destination's libvirt as this host's libvirtd reaches it (qemu+tls://HOST/system)")
			}
			if !live && (destURI != "" || migrateURI != "") {
				return usagef("migrate run: --dest-uri and --migrate-uri are for --live")
			}
			id, err := a.resolveMoving(ctx, src, args[0])
			if err != nil {
				return err
			}
			dst, err := a.dial(ctx, to)
			if err != nil {
				return fmt.Errorf("destination %s: %w", to, err)
			}
			defer func() { _ = dst.Close() }()
			var doc movedDoc
			if live {
				doc, err = moveLive(ctx, src, dst, id, liveTarget{destURI, migrateURI, tenantName, keep})
			} else {
				doc, err = moveOffline(ctx, src, dst, id, tenantName, keep)
			}
			if err != nil {
				return err
			}
			doc.header, doc.To = hdr("Moved"), to
			return a.emit(doc, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "moved VM %s with instance %s to %s: its vGPU is %s there\n", doc.VM, id, to, doc.Device)
				return err
			})
		}),
	}
	cmd.Flags().StringVar(&to, "to", "", "the destination vgpud's D-Bus address")
	cmd.Flags().StringVar(&tenantName, "tenant", "", "tenant that holds the instance on the destination (default: the source's)")
	cmd.Flags().BoolVar(&keep, "keep-source", false, "keep the VM's definition on the source (shut off, without its vGPU's instance)")
	cmd.Flags().BoolVar(&live, "live", false, "move the VM running (libvirt's peer-to-peer live migration)")
	cmd.Flags().StringVar(&destURI, "dest-uri", "", "with --live: the destination's libvirt URI as this host's libvirtd reaches it")
	cmd.Flags().StringVar(&migrateURI, "migrate-uri", "", "with --live: QEMU's data channel, tcp://ADDRESS:PORT on the destination")
	return cmd
}

// moveOffline runs the steps of an offline move. Until the source's
// definition is undefined, a failure gives back what the destination
// carved (and the definition it took) and leaves the VM on the source.
func moveOffline(ctx context.Context, src, dst api, id, tenantName string, keep bool) (movedDoc, error) {
	md, err := src.MigrationSource(ctx, id)
	if err != nil {
		return movedDoc{}, fmt.Errorf("source: %w", err)
	}
	// The VM keeps its name: libvirt finds it by name on both hosts.
	in, err := dst.PrepareIncoming(ctx, md, "", tenantName)
	if err != nil {
		return movedDoc{}, undo(ctx, src, nil, id, fmt.Errorf("destination: %w", err))
	}
	persist, _, err := src.OutgoingDomainXML(ctx, id, in.Device)
	if err == nil && persist == "" {
		err = usagef("the VM of instance %s is transient (no persistent definition); only a defined, shut-off VM moves offline", id)
	}
	if err != nil {
		return movedDoc{}, undo(ctx, src, dst, id, fmt.Errorf("source: %w", err))
	}
	if err := dst.DefineIncomingDomain(ctx, id, persist); err != nil {
		return movedDoc{}, undoDefined(ctx, src, dst, id, fmt.Errorf("destination: %w", err))
	}
	if !keep {
		if err := src.UndefineOutgoingDomain(ctx, id); err != nil {
			return movedDoc{}, undoDefined(ctx, src, dst, id, fmt.Errorf("source: %w", err))
		}
	}
	return finish(ctx, src, dst, id, md, in.Device, keep)
}

// finish records the move on both hosts once libvirt has the VM on the
// destination: a failure here is finished by repeating the call (or by
// either vgpud's reconcile). The source completes even when the
// destination did not record the VM: libvirt has it there (CompleteOutgoing
// acts on libvirt's word), and the destination's next start records it,
// whereas the source would hold its instance for the migration's hold.
func finish(ctx context.Context, src, dst api, id, md, device string, keep bool) (movedDoc, error) {
	if _, err := dst.CommitIncoming(ctx, id); err != nil {
		cause := fmt.Errorf("the VM moved, but the destination did not record it (its next start does, or run `vgpuctl -c DESTINATION migrate commit %s`): %w", id, err)
		if cerr := src.CompleteOutgoing(ctx, id); cerr != nil {
			return movedDoc{}, errors.Join(cause, fmt.Errorf("this host kept its instance (run `vgpuctl migrate complete %s`): %w", id, cerr))
		}
		return movedDoc{}, cause
	}
	if err := src.CompleteOutgoing(ctx, id); err != nil {
		return movedDoc{}, fmt.Errorf("the VM moved, but this host kept its instance (run `vgpuctl migrate complete %s`): %w", id, err)
	}
	var m struct {
		Domain string `json:"domain"`
	}
	_ = json.Unmarshal([]byte(md), &m) // MigrationSource's document; a name only for the report
	return movedDoc{Instance: id, VM: m.Domain, Device: device, KeepSource: keep}, nil
}

// undoDefined gives the move up once the destination may hold the VM's
// definition: only when the source still has the VM (its CancelOutgoing
// succeeds) does the destination undefine its copy and release its
// instance; otherwise the VM may already be the destination's alone, and
// nothing more is undone.
func undoDefined(ctx context.Context, src, dst api, id string, cause error) error {
	if err := src.CancelOutgoing(ctx, id); err != nil {
		return errors.Join(cause, fmt.Errorf("the VM may have left this host, so the destination keeps its definition (look the VM up on both hosts, then `vgpuctl -c DESTINATION migrate commit %s` and `vgpuctl migrate complete %s`): %w", id, id, err))
	}
	if err := dst.UndefineIncomingDomain(ctx, id); err != nil {
		return errors.Join(cause, fmt.Errorf("give back the destination's definition of the VM (it stays on this host too): %w", err))
	}
	if err := dst.AbortIncoming(ctx, id); err != nil {
		return errors.Join(cause, fmt.Errorf("release the destination's instance (run `vgpuctl -c DESTINATION migrate abort %s`): %w", id, err))
	}
	return cause
}

// undo gives back the destination's part (dst nil: nothing was carved
// there) and ends the source's, so that the VM stays where it was; cause
// is the step that failed.
func undo(ctx context.Context, src, dst api, id string, cause error) error {
	var errs []error
	if dst != nil {
		if err := dst.AbortIncoming(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("release the destination's instance (run `vgpuctl -c DESTINATION migrate abort %s`): %w", id, err))
		}
	}
	if err := src.CancelOutgoing(ctx, id); err != nil {
		errs = append(errs, fmt.Errorf("end the move here (run `vgpuctl migrate cancel %s`): %w", id, err))
	}
	if len(errs) == 0 {
		return cause
	}
	return errors.Join(append([]error{cause}, errs...)...)
}

// resolveMoving names the instance to move: an instance (its UUID or the
// start of it), or the VM it is attached to, which must hold exactly one.
func (a *app) resolveMoving(ctx context.Context, c api, arg string) (string, error) {
	if _, err := uuid.Parse(arg); err == nil {
		return a.resolveInstance(ctx, c, arg)
	}
	insts, err := c.Instances(ctx, "")
	if err != nil {
		return "", err
	}
	var held []string
	for _, in := range insts {
		if in.Attachment != nil && in.Attachment.VM == arg {
			held = append(held, in.UUID)
		}
	}
	switch len(held) {
	case 0:
		return a.resolveInstance(ctx, c, arg)
	case 1:
		return held[0], nil
	}
	return "", usagef("VM %s holds %d instances (%s): name the one to move", arg, len(held), strings.Join(held, ", "))
}

// liveTarget is where and how moveLive moves the VM.
type liveTarget struct {
	destURI, migrateURI, tenant string
	keep                        bool
}

// moveLive runs the steps of a live move. The versions are checked before
// anything is carved on the destination; a failed migration leaves the VM
// running on the source, and the destination gives back its instance.
func moveLive(ctx context.Context, src, dst api, id string, o liveTarget) (movedDoc, error) {
	v, err := dst.MigrationTarget(ctx)
	if err != nil {
		return movedDoc{}, fmt.Errorf("destination: %w", err)
	}
	if err := src.PrecheckOutgoingLive(ctx, id, v); err != nil {
		return movedDoc{}, fmt.Errorf("source: %w", err)
	}
	md, err := src.MigrationSource(ctx, id)
	if err != nil {
		return movedDoc{}, fmt.Errorf("source: %w", err)
	}
	in, err := dst.PrepareIncoming(ctx, md, "", o.tenant)
	if err != nil {
		return movedDoc{}, undo(ctx, src, nil, id, fmt.Errorf("destination: %w", err))
	}
	if err := src.MigrateOutgoingLive(ctx, id, in.Device, o.destURI, o.migrateURI, v, o.keep); err != nil {
		return movedDoc{}, undo(ctx, src, dst, id, fmt.Errorf("source: %w", err))
	}
	return finish(ctx, src, dst, id, md, in.Device, o.keep)
}
