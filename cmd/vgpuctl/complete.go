package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/vgpud/vgpud/pkg/version"
)

// completionTimeout keeps a shell responsive when vgpud is slow or gone.
const completionTimeout = 2 * time.Second

type completer func(ctx context.Context, c api, toComplete string) ([]cobra.Completion, error)

// complete asks the daemon for names; any failure completes nothing
// rather than printing an error into the user's command line.
func (a *app) complete(cmd *cobra.Command, toComplete string, fn completer) ([]cobra.Completion, cobra.ShellCompDirective) {
	ctx, cancel := context.WithTimeout(cmd.Context(), completionTimeout)
	defer cancel()
	c, err := a.api(ctx)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	out, err := fn(ctx, c, toComplete)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

func (a *app) completeGPUs(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	return a.complete(cmd, toComplete, func(ctx context.Context, c api, prefix string) ([]cobra.Completion, error) {
		o, err := c.Objects(ctx)
		var out []cobra.Completion
		for _, g := range o.GPUs {
			if strings.HasPrefix(g.PCI, prefix) {
				out = append(out, cobra.CompletionWithDesc(g.PCI, fmt.Sprintf("%s, MIG %s, %s", dash(g.Model), migCell(g), g.State)))
			}
		}
		return out, err
	})
}

func (a *app) completeInstances(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	return a.complete(cmd, toComplete, func(ctx context.Context, c api, prefix string) ([]cobra.Completion, error) {
		insts, err := c.Instances(ctx, "")
		var out []cobra.Completion
		for _, in := range insts {
			if strings.HasPrefix(in.UUID, prefix) {
				out = append(out, cobra.CompletionWithDesc(in.UUID, fmt.Sprintf("%s %s on %s", in.Tenant, in.Profile, in.GPU)))
			}
		}
		return out, err
	})
}

// completeDetach completes `detach [VM] INSTANCE`: first the VMs that
// hold instances and the attached instances (the one-argument form), then,
// after a VM, the instances attached to it, then nothing.
func (a *app) completeDetach(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 1 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return a.complete(cmd, toComplete, func(ctx context.Context, c api, prefix string) ([]cobra.Completion, error) {
		insts, err := c.Instances(ctx, "")
		var out []cobra.Completion
		vms := map[string]bool{}
		for _, in := range insts {
			at := in.Attachment
			if at == nil {
				continue
			}
			if len(args) == 1 && at.VM != args[0] && at.VMUUID != args[0] {
				continue
			}
			if strings.HasPrefix(in.UUID, prefix) {
				out = append(out, cobra.CompletionWithDesc(in.UUID, fmt.Sprintf("%s on VM %s", in.Profile, at.VM)))
			}
			if len(args) == 0 && strings.HasPrefix(at.VM, prefix) && !vms[at.VM] {
				vms[at.VM] = true
				out = append(out, cobra.CompletionWithDesc(at.VM, "VM"))
			}
		}
		return out, err
	})
}

func (a *app) completeTenants(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	return a.complete(cmd, toComplete, func(ctx context.Context, c api, prefix string) ([]cobra.Completion, error) {
		ts, err := c.Tenants(ctx)
		var out []cobra.Completion
		for _, t := range ts {
			if strings.HasPrefix(t.Name, prefix) {
				out = append(out, cobra.CompletionWithDesc(t.Name, fmt.Sprintf("%s, %d instances", t.Class, t.Usage.Instances)))
			}
		}
		return out, err
	})
}

func (a *app) completeProfiles(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	return a.complete(cmd, toComplete, func(ctx context.Context, c api, prefix string) ([]cobra.Completion, error) {
		ps, err := c.Profiles(ctx, "")
		seen := map[string][]string{}
		for _, p := range ps {
			if strings.HasPrefix(p.Name, prefix) {
				seen[p.Name] = append(seen[p.Name], p.Model)
			}
		}
		names := make([]string, 0, len(seen))
		for n := range seen {
			names = append(names, n)
		}
		sort.Strings(names)
		out := make([]cobra.Completion, 0, len(names))
		for _, n := range names {
			out = append(out, cobra.CompletionWithDesc(n, strings.Join(seen[n], ", ")))
		}
		return out, err
	})
}

func (a *app) completionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "Print a shell completion script (GPU, instance, tenant and profile names come from vgpud)",
		Long: `Print a shell completion script. GPU addresses, instance UUIDs, tenant
names and profiles are completed from the running vgpud.

  bash: vgpuctl completion bash > /etc/bash_completion.d/vgpuctl
  zsh:  vgpuctl completion zsh > "${fpath[1]}/_vgpuctl"
  fish: vgpuctl completion fish > ~/.config/fish/completions/vgpuctl.fish`,
		Args:      cobra.ExactArgs(1),
		ValidArgs: []cobra.Completion{"bash", "zsh", "fish"},
		RunE: func(cmd *cobra.Command, args []string) error {
			root := cmd.Root()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(a.out, true)
			case "zsh":
				return root.GenZshCompletion(a.out)
			case "fish":
				return root.GenFishCompletion(a.out, true)
			}
			return usagef("completion %q: want bash, zsh or fish", args[0])
		},
	}
}

// genDocsCmd writes the man pages and completion scripts (scripts/gen-man.sh).
func (a *app) genDocsCmd() *cobra.Command {
	var manDir, compDir string
	cmd := &cobra.Command{
		Use:    "gen-docs --man DIR --completions DIR",
		Short:  "Write man pages and shell completion scripts",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			root := cmd.Root()
			if manDir != "" {
				if err := os.MkdirAll(manDir, 0o755); err != nil {
					return err
				}
				hdr := &doc.GenManHeader{Title: "VGPUCTL", Section: "1", Source: "vgpud " + version.Version, Manual: "vgpud manual"}
				if err := doc.GenManTree(root, hdr, manDir); err != nil {
					return fmt.Errorf("man pages: %w", err)
				}
			}
			if compDir != "" {
				if err := os.MkdirAll(compDir, 0o755); err != nil {
					return err
				}
				for name, gen := range map[string]func(*os.File) error{
					"vgpuctl.bash": func(f *os.File) error { return root.GenBashCompletionV2(f, true) },
					"_vgpuctl":     func(f *os.File) error { return root.GenZshCompletion(f) },
					"vgpuctl.fish": func(f *os.File) error { return root.GenFishCompletion(f, true) },
				} {
					f, err := os.Create(filepath.Join(compDir, name))
					if err != nil {
						return err
					}
					err = gen(f)
					if cerr := f.Close(); err == nil {
						err = cerr
					}
					if err != nil {
						return fmt.Errorf("completion %s: %w", name, err)
					}
				}
			}
			if manDir == "" && compDir == "" {
				return usagef("gen-docs: give --man DIR and/or --completions DIR")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&manDir, "man", "", "directory for the man pages")
	cmd.Flags().StringVar(&compDir, "completions", "", "directory for the completion scripts")
	return cmd
}
