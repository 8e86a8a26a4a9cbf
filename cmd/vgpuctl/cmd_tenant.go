package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// quotaFlags are the quota flags of tenant define and set-quota, parsed
// with pkg/tenant ("80GiB", "2500m", "2.5", "unlimited").
type quotaFlags struct {
	vram, compute, maxInstances string
}

func (q *quotaFlags) bind(cmd *cobra.Command) {
	cmd.Flags().StringVar(&q.vram, "vram", "", `VRAM quota: "80GiB", "40GB", "unlimited"`)
	cmd.Flags().StringVar(&q.compute, "compute", "", `compute quota in GPUs: "2.5", "2500m" (milli-GPU), "unlimited"`)
	cmd.Flags().StringVar(&q.maxInstances, "max-instances", "", `most instances the tenant may hold, or "unlimited"`)
}

// apply parses the flags that were given over q.
func (f quotaFlags) apply(q *dbusapi.Quota) error {
	if f.vram != "" {
		v, err := tenant.ParseBytes(f.vram)
		if err != nil {
			return usagef("--vram: %v", err)
		}
		q.VRAMBytes = dbusapi.Limit(v)
	}
	if f.compute != "" {
		v, err := tenant.ParseCompute(f.compute)
		if err != nil {
			return usagef("--compute: %v", err)
		}
		q.ComputeMilli = dbusapi.Limit(v)
	}
	if f.maxInstances != "" {
		if strings.EqualFold(f.maxInstances, "unlimited") {
			q.MaxInstances = dbusapi.Unlimited
		} else {
			var n uint64
			if _, err := fmt.Sscan(f.maxInstances, &n); err != nil || fmt.Sprint(n) != strings.TrimSpace(f.maxInstances) {
				return usagef("--max-instances %q: want a whole number or unlimited", f.maxInstances)
			}
			q.MaxInstances = dbusapi.Limit(n)
		}
	}
	return nil
}

func (a *app) tenantCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tenant",
		Short: "Define, list, show, set the quota of and undefine tenants",
	}
	cmd.AddCommand(a.tenantDefineCmd(), a.tenantListCmd(), a.tenantShowCmd(), a.tenantSetQuotaCmd(), a.tenantUndefineCmd())
	return cmd
}

func (a *app) tenantDefineCmd() *cobra.Command {
	var q quotaFlags
	var class string
	var models, profiles []string
	cmd := &cobra.Command{
		Use:   "define NAME --vram SIZE --compute GPUS [--max-instances N] [--class guaranteed|best-effort]",
		Short: "Define a tenant with its quota",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if q.vram == "" || q.compute == "" {
				return usagef("tenant define: --vram and --compute are required (\"unlimited\" is a value)")
			}
			if class != "" {
				if _, err := tenant.ParseClass(class); err != nil {
					return usagef("--class %q: want guaranteed or best-effort", class)
				}
			}
			spec := dbusapi.TenantSpec{Name: args[0], Class: class, AllowedModels: models, AllowedProfiles: profiles,
				Quota: dbusapi.Quota{MaxInstances: dbusapi.Unlimited}}
			if err := q.apply(&spec.Quota); err != nil {
				return err
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			c, err := a.api(ctx)
			if err != nil {
				return err
			}
			t, err := c.DefineTenant(ctx, spec)
			if err != nil {
				return err
			}
			return a.emit(tenantDoc{hdr("Tenant"), t}, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "tenant %s defined: VRAM %s, compute %s, instances %s, %s\n", t.Name,
					limitBytes(t.Quota.VRAMBytes), limitCompute(t.Quota.ComputeMilli), limitCount(t.Quota.MaxInstances), t.Class)
				return err
			})
		},
	}
	q.bind(cmd)
	cmd.Flags().StringVar(&class, "class", "", "guaranteed (entitled to its compute share) or best-effort (default)")
	cmd.Flags().StringSliceVar(&models, "allow-model", nil, "GPU models the tenant may use (repeat; default any)")
	cmd.Flags().StringSliceVar(&profiles, "allow-profile", nil, "profiles the tenant may use (repeat; default any)")
	_ = cmd.RegisterFlagCompletionFunc("class", cobra.FixedCompletions([]string{"guaranteed", "best-effort"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("allow-profile", a.completeProfiles)
	return cmd
}

func (a *app) tenantListCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List tenants with their usage and quota",
		Args:    cobra.NoArgs,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, _ []string) error {
			ts, err := c.Tenants(ctx)
			if err != nil {
				return err
			}
			return a.emit(newList("Tenant", ts), func(w io.Writer) error {
				rows := [][]string{}
				for _, t := range ts {
					rows = append(rows, []string{t.Name, t.Class,
						bytesOf(t.Usage.VRAMBytes) + "/" + limitBytes(t.Quota.VRAMBytes),
						computeOf(t.Usage.ComputeMilli) + "/" + limitCompute(t.Quota.ComputeMilli),
						fmt.Sprint(t.Usage.Instances) + "/" + limitCount(t.Quota.MaxInstances)})
				}
				return table(w, []col{{"NAME", 24}, {"CLASS", 11}, {"VRAM USED/QUOTA", 22}, {"COMPUTE USED/QUOTA", 20}, {"INSTANCES", 13}}, rows)
			})
		}),
	}
}

func (a *app) tenantShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "show NAME",
		Short:             "Show a tenant: quota, usage, allowed models and profiles, instances",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeTenants,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, args []string) error {
			t, err := c.Tenant(ctx, args[0])
			if err != nil {
				return err
			}
			return a.emit(tenantDoc{hdr("Tenant"), t}, func(w io.Writer) error {
				anyOf := func(l []string) string {
					if len(l) == 0 {
						return "any"
					}
					return strings.Join(l, ", ")
				}
				writeKV(w, [][2]string{
					{"Name", t.Name}, {"Class", t.Class},
					{"VRAM", bytesOf(t.Usage.VRAMBytes) + " of " + limitBytes(t.Quota.VRAMBytes)},
					{"Compute", computeOf(t.Usage.ComputeMilli) + " of " + limitCompute(t.Quota.ComputeMilli) + " GPU"},
					{"Instances", fmt.Sprint(t.Usage.Instances) + " of " + limitCount(t.Quota.MaxInstances)},
					{"Allowed models", anyOf(t.AllowedModels)}, {"Allowed profiles", anyOf(t.AllowedProfiles)},
				})
				if len(t.NotInCatalog) > 0 {
					fmt.Fprintf(w, "Not in this host's catalog (allow nothing here): %s\n", strings.Join(t.NotInCatalog, ", "))
				}
				for _, id := range t.Instances {
					fmt.Fprintf(w, "  instance %s\n", id)
				}
				return nil
			})
		}),
	}
}

func (a *app) tenantSetQuotaCmd() *cobra.Command {
	var q quotaFlags
	cmd := &cobra.Command{
		Use:               "set-quota NAME [--vram SIZE] [--compute GPUS] [--max-instances N]",
		Short:             "Change a tenant's quota (the flags not given keep their value)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeTenants,
		RunE: func(cmd *cobra.Command, args []string) error {
			if q.vram == "" && q.compute == "" && q.maxInstances == "" {
				return usagef("tenant set-quota: give at least one of --vram, --compute and --max-instances")
			}
			probe := dbusapi.Quota{}
			if err := q.apply(&probe); err != nil {
				return err
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			c, err := a.api(ctx)
			if err != nil {
				return err
			}
			// The flags not given keep their value, which takes a read;
			// with all three given there is nothing to read, so a caller
			// polkit lets change but not read can set a quota.
			var quota dbusapi.Quota
			if q.vram == "" || q.compute == "" || q.maxInstances == "" {
				cur, err := c.Tenant(ctx, args[0])
				if dbusapi.ErrorName(err) == dbusapi.NameAccessDenied {
					return &dbusapi.Error{Name: dbusapi.NameAccessDenied,
						Message: err.Error() + "; or give all of --vram, --compute and --max-instances, which needs no read"}
				}
				if err != nil {
					return err
				}
				quota = cur.Quota
			}
			if err := q.apply(&quota); err != nil {
				return err
			}
			t, err := c.SetQuota(ctx, args[0], quota)
			if err != nil {
				return err
			}
			return a.emit(tenantDoc{hdr("Tenant"), t}, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "tenant %s quota: VRAM %s, compute %s, instances %s\n", t.Name,
					limitBytes(t.Quota.VRAMBytes), limitCompute(t.Quota.ComputeMilli), limitCount(t.Quota.MaxInstances))
				return err
			})
		},
	}
	q.bind(cmd)
	return cmd
}

func (a *app) tenantUndefineCmd() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:               "undefine NAME [--force]",
		Short:             "Remove a tenant (--force destroys its instances first)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeTenants,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, args []string) error {
			if err := c.UndefineTenant(ctx, args[0], force); err != nil {
				return err
			}
			return a.emit(resultDoc{hdr("Result"), "undefine", args[0]}, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "tenant %s undefined\n", args[0])
				return err
			})
		}),
	}
	cmd.Flags().BoolVar(&force, "force", false, "detach and destroy the tenant's instances first")
	return cmd
}
