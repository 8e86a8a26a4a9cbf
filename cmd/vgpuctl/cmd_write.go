package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vgpud/vgpud/pkg/dbusapi"
)

// createFlags are the flags of create and of attach --profile.
type createFlags struct {
	tenant, profile, gpu, uuid, affinity string
	// consumer is a fleet scheduler's Placement consumer (docs/fleet.md).
	consumer string
}

func (a *app) bindCreate(cmd *cobra.Command, f *createFlags) {
	fl := cmd.Flags()
	fl.StringVar(&f.tenant, "tenant", "", "tenant that holds the instance (see vgpuctl tenant list)")
	fl.StringVar(&f.profile, "profile", "", "profile: a MIG profile (3g.40gb, H100-3g.40gb), a compute instance in one (1c.3g.40gb), a vGPU type (L4-4Q) or passthrough")
	fl.StringVar(&f.gpu, "gpu", "", "pin the GPU (PCI address, UUID or index)")
	fl.StringVar(&f.uuid, "uuid", "", "the instance's UUID (makes retries idempotent)")
	fl.StringVar(&f.affinity, "affinity", "", "none, spread (over GPUs) or pack (onto the tenant's GPUs)")
	fl.StringVar(&f.consumer, "placement-consumer", "", "carve what this Placement allocation (a fleet scheduler's consumer UUID) holds on this host; it becomes the instance's UUID")
	_ = cmd.RegisterFlagCompletionFunc("tenant", a.completeTenants)
	_ = cmd.RegisterFlagCompletionFunc("profile", a.completeProfiles)
	_ = cmd.RegisterFlagCompletionFunc("gpu", a.completeGPUs)
	_ = cmd.RegisterFlagCompletionFunc("affinity", cobra.FixedCompletions([]string{"none", "spread", "pack"}, cobra.ShellCompDirectiveNoFileComp))
}

func (f createFlags) request() dbusapi.CreateRequest {
	return dbusapi.CreateRequest{Tenant: f.tenant, Profile: f.profile, GPU: f.gpu, UUID: f.uuid, Affinity: f.affinity, PlacementConsumer: f.consumer}
}

func (a *app) createCmd() *cobra.Command {
	var f createFlags
	cmd := &cobra.Command{
		Use:   "create [PROFILE] --tenant TENANT [--profile PROFILE] [--gpu GPU]",
		Short: "Create an instance for a tenant (quota and capacity are checked atomically)",
		Args:  cobra.MaximumNArgs(1),
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if len(args) > 0 || f.profile != "" {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return a.completeProfiles(cmd, args, toComplete)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if f.profile != "" && f.profile != args[0] {
					return usagef("create: profile given twice (%s and --profile %s)", args[0], f.profile)
				}
				f.profile = args[0]
			}
			if f.profile == "" || f.tenant == "" {
				return usagef("create: give a profile and --tenant (see `vgpuctl profiles` and `vgpuctl tenant list`)")
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			c, err := a.api(ctx)
			if err != nil {
				return err
			}
			in, err := c.Create(ctx, f.request())
			if err != nil {
				return err
			}
			a.warnBehind("create", in.UUID, in.PlacementBehind)
			return a.emit(instanceDoc{hdr("Instance"), in}, func(w io.Writer) error {
				where := ""
				if in.GPU != "" { // empty when the caller may change but not read
					where = " on " + in.GPU
				}
				_, err := fmt.Fprintf(w, "created %s: %s%s for tenant %s\n", in.UUID, in.Profile, where, in.Tenant)
				return err
			})
		},
	}
	a.bindCreate(cmd, &f)
	return cmd
}

func (a *app) destroyCmd() *cobra.Command {
	var detach bool
	cmd := &cobra.Command{
		Use:               "destroy INSTANCE...",
		Short:             "Destroy instances (an attached one needs --detach)",
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: a.completeInstances,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, args []string) error {
			var done []resultDoc
			// stop reports the instances destroyed before a failure: with
			// -o json or yaml too, so a script knows which are gone.
			stop := func(err error) error {
				if a.output != "table" && len(done) > 0 {
					if eerr := a.emit(newList("Result", done), nil); eerr != nil {
						return eerr
					}
				}
				return err
			}
			for _, arg := range args {
				id, err := a.resolveInstance(ctx, c, arg)
				if err != nil {
					return stop(err)
				}
				behind, err := c.DestroyBehind(ctx, id, detach)
				if err != nil {
					return stop(err)
				}
				a.warnBehind("destroy", id, behind)
				done = append(done, resultDoc{hdr("Result"), "destroy", id})
				if a.output == "table" {
					fmt.Fprintf(a.out, "destroyed %s\n", id)
				}
			}
			if a.output == "table" {
				return nil
			}
			return a.emit(newList("Result", done), nil)
		}),
	}
	cmd.Flags().BoolVar(&detach, "detach", false, "detach from the VM first")
	return cmd
}

func (a *app) attachCmd() *cobra.Command {
	var f createFlags
	var display, ramfb bool
	cmd := &cobra.Command{
		Use:   "attach VM [INSTANCE | --profile PROFILE --tenant TENANT]",
		Short: "Attach an instance to a libvirt VM, or create one with --profile and attach it",
		Long: `Attach an instance to a libvirt VM: as a host device in its persistent
configuration, and live when it runs. With --profile (and --tenant) a new
instance is created and attached; if the attach fails it is destroyed
again. Attaching an instance to the VM it is attached to is a no-op.`,
		Args: cobra.RangeArgs(1, 2),
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if len(args) == 1 && f.profile == "" {
				return a.completeInstances(cmd, args[1:], toComplete)
			}
			return nil, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			vm := args[0]
			if (len(args) == 2) == (f.profile != "") {
				return usagef("attach: give an INSTANCE or --profile (with --tenant), not both or neither")
			}
			if f.profile != "" && f.tenant == "" {
				return usagef("attach --profile: --tenant is required")
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			c, err := a.api(ctx)
			if err != nil {
				return err
			}
			var in dbusapi.Instance
			if f.profile != "" {
				in, err = c.CreateAndAttach(ctx, f.request(), vm, dbusapi.AttachOptions{Display: display, RamFB: ramfb})
			} else {
				var id string
				if id, err = a.resolveInstance(ctx, c, args[1]); err != nil {
					return err
				}
				in, err = c.Attach(ctx, id, vm, dbusapi.AttachOptions{Display: display, RamFB: ramfb, Tenant: f.tenant})
			}
			if err != nil {
				return err
			}
			a.warnBehind("create", in.UUID, in.PlacementBehind)
			return a.emit(instanceDoc{hdr("Instance"), in}, func(w io.Writer) error {
				how := "configuration"
				if in.Attachment != nil && in.Attachment.Live {
					how = "configuration and running VM"
				}
				what := in.UUID
				if in.Profile != "" { // empty when the caller may change but not read
					what += " (" + in.Profile + ")"
				}
				_, err := fmt.Fprintf(w, "attached %s to %s (%s)\n", what, vm, how)
				return err
			})
		},
	}
	a.bindCreate(cmd, &f)
	cmd.Flags().BoolVar(&display, "display", false, "turn on the display of a Q-series mdev vGPU (the VM needs a graphics device)")
	cmd.Flags().BoolVar(&ramfb, "ramfb", false, "add a boot framebuffer to the display, so the console shows the guest before its vGPU driver loads (implies --display)")
	return cmd
}

func (a *app) detachCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "detach [VM] INSTANCE",
		Short:             "Detach an instance from its VM (live, then from the configuration)",
		Args:              cobra.RangeArgs(1, 2),
		ValidArgsFunction: a.completeDetach,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, args []string) error {
			id, err := a.resolveInstance(ctx, c, args[len(args)-1])
			if err != nil {
				return err
			}
			if len(args) == 2 {
				// Naming the VM guards against detaching from the wrong one.
				in, err := c.Instance(ctx, id)
				if err != nil {
					return err
				}
				if in.Attachment == nil {
					return &dbusapi.Error{Name: dbusapi.NameNotFound, Message: fmt.Sprintf("instance %s is not attached to a VM", id)}
				}
				if !strings.EqualFold(in.Attachment.VM, args[0]) && in.Attachment.VMUUID != args[0] {
					return &dbusapi.Error{Name: dbusapi.NameConflict, Message: fmt.Sprintf("instance %s is attached to VM %s, not %s; check the VM name", id, in.Attachment.VM, args[0])}
				}
			}
			if err := c.Detach(ctx, id); err != nil {
				return err
			}
			return a.emit(resultDoc{hdr("Result"), "detach", id}, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "detached %s\n", id)
				return err
			})
		}),
	}
}

func (a *app) reconcileCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "reconcile",
		Short: "Compare vgpud's records with the host now and repair what differs",
		Args:  cobra.NoArgs,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, _ []string) error {
			r, err := c.Reconcile(ctx)
			if err != nil {
				return err
			}
			return a.emit(reconcileDoc{hdr("ReconcileReport"), r}, func(w io.Writer) error {
				fmt.Fprintf(w, "reconciled in %.3fs: %d finished, %d undone, %d re-created, %d lost, %d failed, %d foreign, %d pending\n",
					r.DurationSeconds, len(r.Finished), len(r.Undone), len(r.Recreated), len(r.Lost), len(r.Failed), len(r.Foreign), len(r.Pending))
				for _, f := range r.Foreign {
					fmt.Fprintf(w, "  foreign %s %s on %s: %s\n", f.Kind, f.ID, f.GPU, dash(f.Detail))
				}
				for _, h := range foreignHints(r.Foreign) {
					fmt.Fprintln(w, "  "+h)
				}
				for _, p := range r.Pending {
					fmt.Fprintf(w, "  pending %s\n", p)
				}
				return nil
			})
		}),
	}
}

func (a *app) defragCmd() *cobra.Command {
	var tenantName, gpu string
	var apply bool
	cmd := &cobra.Command{
		Use:               "defrag PROFILE --tenant TENANT [--apply]",
		Short:             "Show (or with --apply perform) the MIG moves that would make room for a profile",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeProfiles,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, args []string) error {
			r, err := c.Defragment(ctx, dbusapi.PlanRequest{Tenant: tenantName, Profile: args[0], GPU: gpu}, apply)
			if err != nil {
				return err
			}
			return a.emit(defragDoc{hdr("Defragment"), r}, func(w io.Writer) error {
				verb := "would move"
				if r.Applied {
					verb = "moved"
				}
				for _, m := range r.Moves {
					fmt.Fprintf(w, "%s %s (%s) from %s:%d to %s:%d\n", verb, short(m.Instance, false), m.Profile, m.FromGPU, m.FromStart, m.ToGPU, m.ToStart)
				}
				fmt.Fprintf(w, "%s then fits on %s slot %d\n", args[0], r.GPU, r.Start)
				return nil
			})
		}),
	}
	cmd.Flags().StringVar(&tenantName, "tenant", "", "tenant of the request (required)")
	cmd.Flags().StringVar(&gpu, "gpu", "", "pin the GPU")
	cmd.Flags().BoolVar(&apply, "apply", false, "perform the moves")
	_ = cmd.MarkFlagRequired("tenant")
	_ = cmd.RegisterFlagCompletionFunc("tenant", a.completeTenants)
	_ = cmd.RegisterFlagCompletionFunc("gpu", a.completeGPUs)
	return cmd
}

// foreignHints says, once per kind of foreign device listed, that vgpud
// leaves such devices alone and how to hand one over to it: vgpud never
// adopts a device it did not create, so the device goes and vgpud creates
// its own in the room it leaves. Lines fit the 100-column tables.
func foreignHints(fs []dbusapi.Foreign) []string {
	kinds := map[string]bool{}
	for _, f := range fs {
		kinds[f.Kind] = true
	}
	var out []string
	if kinds["mdev"] {
		out = append(out,
			"foreign mdevs stay as they are: vgpud never re-creates or removes them. To hand one to vgpud:",
			"  stop the VM using it; `mdevctl undefine -u UUID` if mdevctl defines it (else it returns",
			"  at boot); `mdevctl stop -u UUID` (or write 1 to /sys/bus/mdev/devices/UUID/remove);",
			"  then `vgpuctl create` and `vgpuctl attach`")
	}
	if kinds["vf"] {
		out = append(out,
			"foreign vGPUs on VFs stay as they are. To hand one to vgpud: stop the VM using it,",
			"  write 0 to the VF's nvidia/current_vgpu_type, then `vgpuctl create`")
	}
	if kinds["gpu-instance"] {
		out = append(out,
			"foreign GPU instances stay as they are. To hand one to vgpud: destroy it",
			"  (`nvidia-smi mig -dci -gi ID -i GPU`, then `-dgi`), then `vgpuctl create`")
	}
	return out
}

// warnBehind tells the operator, on standard error, that an operation
// succeeded but left Placement to the sync (a scheduler reading it now
// sees the old room). The exit code stays 0: the operation is done.
func (a *app) warnBehind(op, id, behind string) {
	if behind != "" {
		fmt.Fprintf(a.err, "vgpuctl: warning: %s %s: Placement not brought up to date: %s\n", op, id, behind)
	}
}
