package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/version"
)

// resolveInstance accepts a full UUID or a unique prefix of one (the
// 8 characters tables show).
func (a *app) resolveInstance(ctx context.Context, c api, arg string) (string, error) {
	if u, err := uuid.Parse(arg); err == nil {
		return u.String(), nil
	}
	if len(arg) < 4 {
		return "", usagef("instance %q: give its UUID or at least 4 of its first characters (see `vgpuctl list`)", arg)
	}
	insts, err := c.Instances(ctx, "")
	if err != nil {
		return "", err
	}
	var found []string
	for _, in := range insts {
		if strings.HasPrefix(in.UUID, strings.ToLower(arg)) {
			found = append(found, in.UUID)
		}
	}
	switch len(found) {
	case 0:
		return "", &dbusapi.Error{Name: dbusapi.NameNotFound, Message: fmt.Sprintf("no instance %s (run `vgpuctl list`)", arg)}
	case 1:
		return found[0], nil
	}
	return "", usagef("instance %q is ambiguous: %s; give more of its UUID", arg, strings.Join(found, ", "))
}

func (a *app) gpusCmd() *cobra.Command {
	var full bool
	cmd := &cobra.Command{
		Use:   "gpus [--no-trunc]",
		Short: "List the host's GPUs",
		Args:  cobra.NoArgs,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, _ []string) error {
			o, err := c.Objects(ctx)
			if err != nil {
				return err
			}
			return a.emit(newList("GPU", o.GPUs), func(w io.Writer) error { return gpuTable(w, o.GPUs, full) })
		}),
	}
	cmd.Flags().BoolVar(&full, "no-trunc", false, "show whole cells, marked \"~\" when cut otherwise (wider than 100 columns)")
	return cmd
}

func migCell(g dbusapi.GPU) string {
	if !g.MIG.Capable {
		return "-"
	}
	s := onOff(g.MIG.Enabled)
	if g.MIG.Pending != g.MIG.Enabled {
		s += "*"
	}
	return s
}

func gpuTable(w io.Writer, gpus []dbusapi.GPU, full bool) error {
	rows := [][]string{}
	pending := false
	for _, g := range gpus {
		pending = pending || (g.MIG.Capable && g.MIG.Pending != g.MIG.Enabled)
		state := g.State
		if g.Reason != "" {
			state += ": " + g.Reason
		}
		rows = append(rows, []string{g.PCI, dash(g.Model), bytesOf(g.MemoryBytes), migCell(g), dash(g.VGPU.Flavour), state, fmt.Sprint(len(g.Instances))})
	}
	err := table(w, trunc([]col{{"PCI", 12}, {"MODEL", 22}, {"MEMORY", 9}, {"MIG", 4}, {"VGPU", 5}, {"STATE", 24}, {"INSTANCES", 9}}, !full), rows)
	if pending {
		fmt.Fprintln(w, "* MIG mode changes at the GPU's next reset")
	}
	return err
}

func (a *app) gpuCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "gpu",
		Short: "Show one GPU or change its MIG mode, heterogeneous vGPU mode or vGPU scheduler",
	}
	show := &cobra.Command{
		Use:               "show GPU",
		Short:             "Show one GPU (by PCI address, UUID or index)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeGPUs,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, args []string) error {
			g, err := c.GPU(ctx, args[0])
			if err != nil {
				return err
			}
			return a.emit(gpuDoc{hdr("GPU"), g}, func(w io.Writer) error { return gpuDetail(w, g) })
		}),
	}
	mode := func(use, short, what string, fn func(api, context.Context, string, bool) error) *cobra.Command {
		return &cobra.Command{
			Use:   use + " GPU on|off",
			Short: short,
			Args:  cobra.ExactArgs(2),
			ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
				if len(args) == 1 {
					return []cobra.Completion{"on", "off"}, cobra.ShellCompDirectiveNoFileComp
				}
				return a.completeGPUs(cmd, args, toComplete)
			},
			RunE: func(cmd *cobra.Command, args []string) error {
				on, err := parseOnOff(args[1])
				if err != nil {
					return err
				}
				ctx, cancel := a.ctx(cmd)
				defer cancel()
				c, err := a.api(ctx)
				if err != nil {
					return err
				}
				if err := fn(c, ctx, args[0], on); err != nil {
					return err
				}
				return a.emit(resultDoc{hdr("Result"), what, args[0]}, func(w io.Writer) error {
					_, err := fmt.Fprintf(w, "%s of GPU %s is %s\n", what, args[0], onOff(on))
					return err
				})
			},
		}
	}
	clear := &cobra.Command{
		Use:   "clear GPU",
		Short: "Return a failed GPU to service once you checked or reset it (its instances come back)",
		Long: `Return a GPU that a critical XID failed to service, once you checked it or
reset it while vgpud was down, and reconcile, which brings its instances
back. vgpud clears a failed GPU itself when it is reset or the host reboots;
a lost GPU (fallen off the bus) returns by itself when it answers again.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeGPUs,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, args []string) error {
			if err := c.ClearGPU(ctx, args[0]); err != nil {
				return err
			}
			return a.emit(resultDoc{hdr("Result"), "clear", args[0]}, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "GPU %s is in service\n", args[0])
				return err
			})
		}),
	}
	cmd.AddCommand(show, clear, a.gpuSchedulerCmd(),
		mode("mig", "Turn MIG mode on or off (refused while vgpud instances live on the GPU)", "MIG mode", api.SetMIGMode),
		mode("heterogeneous", "Allow time-sliced vGPUs of different sizes on one GPU, or not", "heterogeneous vGPU mode", api.SetHeterogeneous))
	return cmd
}

// gpuDetail is gpu show's text: one instance per line, as tenant show
// has them, so a GPU with many instances stays within 100 columns.
func gpuDetail(w io.Writer, g dbusapi.GPU) error {
	writeKV(w, [][2]string{
		{"PCI", g.PCI}, {"UUID", g.UUID}, {"Index", fmt.Sprint(g.Index)}, {"Model", dash(g.Model)}, {"Product", g.Product},
		{"Memory", bytesOf(g.MemoryBytes)}, {"NUMA node", fmt.Sprint(g.NUMANode)}, {"Driver", dash(g.KernelDriver)},
		{"State", g.State}, {"Reason", dash(g.Reason)}, {"MIG", migCell(g)}, {"vGPU flavour", dash(g.VGPU.Flavour)},
		{"Heterogeneous", onOff(g.VGPU.Heterogeneous)}, {"VFs", fmt.Sprintf("%d of %d", g.VGPU.NumVFs, g.VGPU.TotalVFs)},
		{"Scheduler", schedCell(g.Scheduler)}, {"Instances", fmt.Sprint(len(g.Instances))},
	})
	for _, id := range g.Instances {
		fmt.Fprintf(w, "  instance %s\n", id)
	}
	if len(g.MIG.Instances) > 0 {
		fmt.Fprintln(w)
		rows := [][]string{}
		for _, gi := range g.MIG.Instances {
			rows = append(rows, []string{fmt.Sprint(gi.ID), dash(gi.Profile), fmt.Sprint(gi.Start), fmt.Sprint(gi.Size), fmt.Sprint(gi.ComputeInstances)})
		}
		if err := table(w, []col{{"GPU-INSTANCE", 0}, {"PROFILE", 20}, {"START", 0}, {"SIZE", 0}, {"COMPUTE", 0}}, rows); err != nil {
			return err
		}
	}
	giSchedLines(w, g.GPUInstanceSchedulers)
	for _, e := range g.Errors {
		fmt.Fprintf(w, "error: %s\n", e)
	}
	return nil
}

func parseOnOff(s string) (bool, error) {
	switch strings.ToLower(s) {
	case "on", "true", "yes", "1", "enable":
		return true, nil
	case "off", "false", "no", "0", "disable":
		return false, nil
	}
	return false, usagef("%q: want on or off", s)
}

func writeKV(w io.Writer, kv [][2]string) {
	width := 0
	for _, p := range kv {
		width = max(width, len(p[0]))
	}
	for _, p := range kv {
		fmt.Fprintf(w, "%-*s  %s\n", width+1, p[0]+":", p[1])
	}
}

func (a *app) profilesCmd() *cobra.Command {
	var gpu string
	cmd := &cobra.Command{
		Use:   "profiles [--gpu GPU]",
		Short: "List the profiles (MIG GPU- and compute-instance profiles, vGPU types, passthrough) of the host's GPU models",
		Args:  cobra.NoArgs,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, _ []string) error {
			ps, err := c.Profiles(ctx, gpu)
			if err != nil {
				return err
			}
			return a.emit(newList("Profile", ps), func(w io.Writer) error {
				rows := [][]string{}
				vram := make([]uint64, len(ps))
				for i, p := range ps {
					vram[i] = p.VRAMBytes
				}
				mem := bytesColumn(vram) // one unit in the column
				for i, p := range ps {
					rows = append(rows, []string{p.Model, p.Name, p.Kind, mem[i], computeOf(p.ComputeMilli), fmt.Sprint(p.MaxPerGPU), dash(strings.Join(p.Flows, ","))})
				}
				return table(w, []col{{"MODEL", 20}, {"PROFILE", 22}, {"KIND", 11}, {"VRAM", 8}, {"COMPUTE", 7}, {"MAX/GPU", 7}, {"FLOWS", 10}}, rows)
			})
		}),
	}
	cmd.Flags().StringVar(&gpu, "gpu", "", "only this GPU's model (PCI address, UUID or index)")
	_ = cmd.RegisterFlagCompletionFunc("gpu", a.completeGPUs)
	return cmd
}

func (a *app) capacityCmd() *cobra.Command {
	var model, kind string
	var all bool
	cmd := &cobra.Command{
		Use:   "capacity",
		Short: "How many more instances of each profile fit now, per GPU model",
		Long: `How many more instances of each profile fit now, per GPU model: the
placement inventory an orchestrator reports. Each profile is counted on its
own: placing one changes the others' counts. Profiles with no room are
hidden unless --all.`,
		Args: cobra.NoArgs,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, _ []string) error {
			caps, err := c.Capacity(ctx)
			if err != nil {
				return err
			}
			var out []dbusapi.Capacity
			for _, x := range caps {
				if (model == "" || x.Model == model) && (kind == "" || x.Kind == kind) && (all || x.Count > 0 || a.output != "table") {
					out = append(out, x)
				}
			}
			return a.emit(newList("Capacity", out), func(w io.Writer) error {
				rows := [][]string{}
				for _, x := range out {
					rows = append(rows, []string{x.Model, x.Profile, x.Kind, fmt.Sprint(x.Count), fmt.Sprint(x.GPUs)})
				}
				return table(w, []col{{"MODEL", 22}, {"PROFILE", 24}, {"KIND", 11}, {"FREE", 6}, {"GPUS", 5}}, rows)
			})
		}),
	}
	cmd.Flags().StringVar(&model, "model", "", "only this GPU model")
	cmd.Flags().StringVar(&kind, "kind", "", "only this kind: mig, mig-vgpu, vgpu or passthrough")
	cmd.Flags().BoolVar(&all, "all", false, "also list profiles with no room (JSON and YAML always list them)")
	_ = cmd.RegisterFlagCompletionFunc("kind", cobra.FixedCompletions([]string{"mig", "mig-vgpu", "vgpu", "passthrough"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func (a *app) listCmd() *cobra.Command {
	var tenantName string
	var full bool
	cmd := &cobra.Command{
		Use:     "list [--tenant TENANT]",
		Aliases: []string{"ls"},
		Short:   "List instances",
		Args:    cobra.NoArgs,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, _ []string) error {
			insts, err := c.Instances(ctx, tenantName)
			if err != nil {
				return err
			}
			return a.emit(newList("Instance", insts), func(w io.Writer) error { return instanceTable(w, insts, full) })
		}),
	}
	cmd.Flags().StringVar(&tenantName, "tenant", "", "only this tenant's instances")
	cmd.Flags().BoolVar(&full, "no-trunc", false, "show whole UUIDs and cells (wider than 100 columns)")
	_ = cmd.RegisterFlagCompletionFunc("tenant", a.completeTenants)
	return cmd
}

func instanceTable(w io.Writer, insts []dbusapi.Instance, full bool) error {
	rows := [][]string{}
	for _, in := range insts {
		vm := "-"
		if in.Attachment != nil {
			vm = in.Attachment.VM
			if in.Attachment.Live {
				vm += "*"
			}
		}
		rows = append(rows, []string{short(in.UUID, full), in.Tenant, in.Profile, in.Kind, in.GPU, in.State, vm})
	}
	return table(w, trunc([]col{{"INSTANCE", 8}, {"TENANT", 14}, {"PROFILE", 18}, {"KIND", 11}, {"GPU", 12}, {"STATE", 10}, {"VM", 14}}, !full), rows)
}

func (a *app) showCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "show INSTANCE",
		Short:             "Show one instance",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeInstances,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, args []string) error {
			id, err := a.resolveInstance(ctx, c, args[0])
			if err != nil {
				return err
			}
			in, err := c.Instance(ctx, id)
			if err != nil {
				return err
			}
			return a.emit(instanceDoc{hdr("Instance"), in}, func(w io.Writer) error { return instanceDetail(w, in) })
		}),
	}
}

// computeInstanceOf describes a MIG instance's compute instance: the
// compute slices it takes of its GPU instance, or all of them.
func computeInstanceOf(m *dbusapi.InstanceMIG) string {
	where := "the whole GPU instance"
	if m.ComputeInstanceSlices > 0 {
		where = fmt.Sprintf("compute slices %d-%d", m.ComputeInstanceStart, m.ComputeInstanceStart+m.ComputeInstanceSlices-1)
	}
	return fmt.Sprintf("id %d, profile %d, %s", m.ComputeInstanceID, m.ComputeInstanceProfileID, where)
}

func instanceDetail(w io.Writer, in dbusapi.Instance) error {
	kv := [][2]string{
		{"UUID", in.UUID}, {"Tenant", in.Tenant}, {"Profile", in.Profile}, {"Kind", in.Kind}, {"Model", in.Model},
		{"GPU", in.GPU + " (" + in.GPUUUID + ")"}, {"State", in.State}, {"Reason", dash(in.Reason)},
		{"VRAM", bytesOf(in.VRAMBytes)}, {"Compute", computeOf(in.ComputeMilli) + " GPU"},
	}
	if in.MIG != nil {
		kv = append(kv, [2]string{"GPU instance", fmt.Sprintf("id %d, profile %d, slots %d-%d", in.MIG.GPUInstanceID, in.MIG.GPUInstanceProfileID, in.MIG.Start, in.MIG.Start+in.MIG.Size-1)})
		if in.Kind == "mig" {
			kv = append(kv, [2]string{"Compute instance", computeInstanceOf(in.MIG)})
		}
	}
	if in.VGPU != nil {
		dev := in.VGPU.VF
		if in.VGPU.MdevUUID != "" {
			dev = "mdev " + in.VGPU.MdevUUID + " on " + in.VGPU.MdevParent
		}
		kv = append(kv, [2]string{"vGPU", fmt.Sprintf("%s (type %d, %s flow, %s)", in.VGPU.Type, in.VGPU.TypeID, in.VGPU.Flow, dash(dev))})
	}
	vm := "-"
	if in.Attachment != nil {
		vm = in.Attachment.VM + " (" + in.Attachment.VMUUID + ")"
		if in.Attachment.Live {
			vm += ", live"
		} else {
			vm += ", configuration only"
		}
	}
	kv = append(kv, [2]string{"VM", vm}, [2]string{"Created", in.Created.Local().Format(time.RFC3339)})
	writeKV(w, kv)
	return nil
}

func (a *app) dumpxmlCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "dumpxml INSTANCE",
		Short:             "Print the libvirt <hostdev> element of an instance (what virsh attach-device takes)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeInstances,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, args []string) error {
			id, err := a.resolveInstance(ctx, c, args[0])
			if err != nil {
				return err
			}
			doc, err := c.HostdevXML(ctx, id)
			if err != nil {
				return err
			}
			return a.emit(hostdevDoc{hdr("Hostdev"), id, doc}, func(w io.Writer) error {
				_, err := fmt.Fprintln(w, strings.TrimRight(doc, "\n"))
				return err
			})
		}),
	}
}

func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print vgpuctl's and vgpud's versions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			doc := versionDoc{header: hdr("Version"), Client: version.Version}
			c, err := a.api(ctx)
			if err == nil {
				doc.Daemon, err = c.Version(ctx)
			}
			if err != nil {
				doc.Error = err.Error()
			}
			return a.emit(doc, func(w io.Writer) error {
				fmt.Fprintf(w, "vgpuctl %s\n", doc.Client)
				if doc.Daemon != "" {
					fmt.Fprintf(w, "vgpud   %s\n", doc.Daemon)
				} else {
					fmt.Fprintf(w, "vgpud   unknown (%s)\n", doc.Error)
				}
				return nil
			})
		},
	}
}

func (a *app) planCmd() *cobra.Command {
	var tenantName, gpu, file, sel string
	cmd := &cobra.Command{
		Use:   "plan PROFILE [--tenant T] [--gpu GPU] | plan -f FILE [--select NAME]",
		Short: "Show where a profile would go, or what a layout file would change; nothing changes",
		Args:  cobra.MaximumNArgs(1),
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if file != "" || len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return a.completeProfiles(cmd, args, toComplete)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if file != "" {
				if len(args) > 0 {
					return usagef("plan: give a profile or -f FILE, not both")
				}
				return a.runApply(cmd, file, sel, true)
			}
			if len(args) != 1 {
				return usagef("plan: give a profile (see `vgpuctl profiles`) or -f FILE")
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			c, err := a.api(ctx)
			if err != nil {
				return err
			}
			p, err := c.Plan(ctx, dbusapi.PlanRequest{Tenant: tenantName, Profile: args[0], GPU: gpu})
			if err != nil {
				return err
			}
			return a.emit(planDoc{hdr("Plan"), p}, func(w io.Writer) error { return planText(w, p) })
		},
	}
	cmd.Flags().StringVar(&tenantName, "tenant", "", "check this tenant's quota too")
	cmd.Flags().StringVar(&gpu, "gpu", "", "pin the GPU (PCI address, UUID or index)")
	cmd.Flags().StringVarP(&file, "file", "f", "", "layout file to diff against the host (vgpud, mig-parted or vgpu-device-manager format; - for stdin)")
	cmd.Flags().StringVar(&sel, "select", "", "named config of a mig-parted or vgpu-device-manager file (NAME or NAME@TENANT)")
	_ = cmd.RegisterFlagCompletionFunc("tenant", a.completeTenants)
	_ = cmd.RegisterFlagCompletionFunc("gpu", a.completeGPUs)
	return cmd
}

func planText(w io.Writer, p dbusapi.Plan) error {
	if p.Fits {
		where := p.GPU
		if p.Start >= 0 {
			where += fmt.Sprintf(" slot %d", p.Start)
		}
		if p.Device != "" {
			where += " on " + p.Device
		}
		fmt.Fprintf(w, "%s fits on %s (%s): %s\n", p.Profile, where, p.Model, p.Reason)
		fmt.Fprintf(w, "takes %s VRAM and %s GPU of compute\n", bytesOf(p.VRAMBytes), computeOf(p.ComputeMilli))
		if p.Tenant != "" {
			if p.QuotaOK {
				fmt.Fprintf(w, "tenant %s's quota admits it\n", p.Tenant)
			} else {
				fmt.Fprintf(w, "tenant %s's quota refuses it: %s\n", p.Tenant, p.QuotaMessage)
			}
		}
	} else {
		fmt.Fprintf(w, "%s does not fit: %s\n", p.Profile, p.Refusal)
		for _, m := range p.Moves {
			fmt.Fprintf(w, "  would fit after moving %s (%s) from %s:%d to %s:%d (`vgpuctl defrag`)\n", short(m.Instance, false), m.Profile, m.FromGPU, m.FromStart, m.ToGPU, m.ToStart)
		}
	}
	var free []dbusapi.Capacity
	for _, c := range p.FreeAfter {
		if c.Count > 0 && c.Kind != "passthrough" {
			free = append(free, c)
		}
	}
	sort.SliceStable(free, func(i, j int) bool { return free[i].Count > free[j].Count })
	if len(free) == 0 {
		return nil
	}
	if p.Fits {
		fmt.Fprintln(w, "\nroom left afterwards:")
	} else {
		fmt.Fprintln(w, "\nroom now:")
	}
	const shown = 12
	rows := [][]string{}
	for i, c := range free {
		if i == shown {
			break
		}
		rows = append(rows, []string{c.Model, c.Profile, c.Kind, fmt.Sprint(c.Count)})
	}
	if err := table(w, []col{{"MODEL", 22}, {"PROFILE", 24}, {"KIND", 11}, {"FREE", 6}}, rows); err != nil {
		return err
	}
	if len(free) > shown {
		fmt.Fprintf(w, "... and %d more profiles (-o json lists them all)\n", len(free)-shown)
	}
	return nil
}
