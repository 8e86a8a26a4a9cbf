package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vgpud/vgpud/pkg/dbusapi"
)

// migrate: the host side of moving a VM with its vGPU between two vgpud
// hosts (docs/operations.md, "Moving VMs"), one call of one host per
// subcommand; --connect names the host.

// incomingDoc is migrate prepare's JSON document.
type incomingDoc struct {
	header
	Incoming dbusapi.Incoming `json:"incoming"`
}

// compatNames names the VM states of the driver's compatibility mask.
func compatNames(mask uint32) string {
	var out []string
	for _, s := range []struct {
		bit  uint32
		name string
	}{{1, "cold"}, {2, "hibernate"}, {4, "sleep"}, {8, "live"}} {
		if mask&s.bit != 0 {
			out = append(out, s.name)
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ",")
}

func (a *app) migrateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Move a VM with its vGPU to another vgpud host: each host's part (--connect names the host)",
		Long: `The host side of moving a running VM with its vGPU to another vgpud host.
On the source, "migrate source" prints the migration metadata; on the
destination, "migrate prepare" carves an instance for the VM from them, after
the driver said a GPU takes the vGPU, and prints the device the VM's
definition must name there. Once libvirt moved the VM, "migrate commit" on the
destination and "migrate complete" on the source; when libvirt failed,
"migrate abort" on the destination and "migrate cancel" on the source.`,
	}
	end := func(use, short, op string, call func(api) func(context.Context, string) error) *cobra.Command {
		return &cobra.Command{
			Use: use + " INSTANCE", Short: short, Args: cobra.ExactArgs(1), ValidArgsFunction: a.completeInstances,
			RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, args []string) error {
				id, err := a.resolveInstance(ctx, c, args[0])
				if err != nil {
					return err
				}
				if err := call(c)(ctx, id); err != nil {
					return err
				}
				return a.emit(resultDoc{hdr("Result"), op, id}, func(w io.Writer) error {
					_, err := fmt.Fprintf(w, "%s %s\n", op, id)
					return err
				})
			}),
		}
	}
	cmd.AddCommand(a.migrateRunCmd(), a.migrateSourceCmd(), a.migratePrepareCmd(), a.migrateCommitCmd(),
		end("abort", "Release the instance prepared for a VM that did not come (destination)", "migrate-abort",
			func(c api) func(context.Context, string) error { return c.AbortIncoming }),
		end("complete", "Release the instance whose VM moved away, with its attachment (source)", "migrate-complete",
			func(c api) func(context.Context, string) error { return c.CompleteOutgoing }),
		end("cancel", "End the move of a VM that stayed; the instance is kept (source)", "migrate-cancel",
			func(c api) func(context.Context, string) error { return c.CancelOutgoing }))
	return cmd
}

func (a *app) migrateSourceCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "source INSTANCE",
		Short:             "Start moving the VM of an instance away; print the migration metadata (source)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeInstances,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, args []string) error {
			id, err := a.resolveInstance(ctx, c, args[0])
			if err != nil {
				return err
			}
			md, err := c.MigrationSource(ctx, id)
			if err != nil {
				return err
			}
			// The document is the destination's input whatever the
			// output format: printed as it came.
			_, err = fmt.Fprintln(a.out, md)
			return err
		}),
	}
}

func (a *app) migratePrepareCmd() *cobra.Command {
	var vm, tenantName string
	cmd := &cobra.Command{
		Use:   "prepare FILE [--vm VM] [--tenant TENANT]",
		Short: "Carve the instance for a VM moving in, from the source's metadata (FILE, or - for standard input) (destination)",
		Args:  cobra.ExactArgs(1),
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, args []string) error {
			var data []byte
			var err error
			if args[0] == "-" {
				data, err = io.ReadAll(io.LimitReader(a.in, 1<<20))
			} else {
				data, err = os.ReadFile(args[0])
			}
			if err != nil {
				return usagef("migrate prepare: read the metadata: %v", err)
			}
			in, err := c.PrepareIncoming(ctx, strings.TrimSpace(string(data)), vm, tenantName)
			if err != nil {
				return err
			}
			return a.emit(incomingDoc{hdr("Incoming"), in}, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "prepared %s: the VM names %s here; the driver moves it %s\n", in.Instance, in.Device, compatNames(in.VMCompatibility))
				return err
			})
		}),
	}
	cmd.Flags().StringVar(&vm, "vm", "", "the VM's libvirt domain name here (default: the source's)")
	cmd.Flags().StringVar(&tenantName, "tenant", "", "tenant that holds the instance here (default: the source's)")
	_ = cmd.RegisterFlagCompletionFunc("tenant", a.completeTenants)
	return cmd
}

func (a *app) migrateCommitCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "commit INSTANCE",
		Short:             "Record that the VM arrived with its instance (destination)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeInstances,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, args []string) error {
			id, err := a.resolveInstance(ctx, c, args[0])
			if err != nil {
				return err
			}
			att, err := c.CommitIncoming(ctx, id)
			if err != nil {
				return err
			}
			return a.emit(resultDoc{hdr("Result"), "migrate-commit", id}, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "committed %s: VM %s holds it (live: %v)\n", id, att.VMUUID, att.Live)
				return err
			})
		}),
	}
}
