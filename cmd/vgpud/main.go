// Command vgpud is the vgpud host daemon. Subcommands print the host
// inventory and drive the simulated host; without one it runs the daemon.
//
// Imports: pkg/..., profiles.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/vgpud/vgpud/pkg/config"
	"github.com/vgpud/vgpud/pkg/version"
)

func main() {
	// No heap profiles: vgpud serves no pprof endpoint, and the sampling
	// profiler's bucket table is 1.4 MiB that sampled allocations touch
	// page by page until all of it is resident (measured under
	// make bench-metrics: a tenth of the daemon's anonymous memory). Set
	// first thing, before the daemon allocates.
	runtime.MemProfileRate = 0
	// The heap may grow to 1.5 times what the last GC found live, not
	// twice (GOGC=100): vgpud keeps some 5 MiB live and allocates mostly
	// per scrape and per collection, so the default's headroom was a
	// third of its resident memory. A cycle marks those few MiB in a few
	// ms; make bench-metrics measures the idle CPU and scrape latency
	// with it. GOGC in the environment (the unit's, say) overrides it.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "vgpud:", err)
		var ec exitCoder
		if errors.As(err, &ec) {
			os.Exit(ec.ExitCode())
		}
		os.Exit(1)
	}
}

// gcPercent is the daemon's GOGC unless the environment sets one.
const gcPercent = 50

type exitCoder interface{ ExitCode() int }

type usageError struct{ error }

func (usageError) ExitCode() int { return 2 }

// loadConfig loads cfg from its file and the flags fs parsed; a
// configuration that does not validate is a usage error (exit status 2).
func loadConfig(cfg *config.Config, fs *pflag.FlagSet) error {
	err := cfg.Load(fs)
	if inv := (*config.InvalidError)(nil); errors.As(err, &inv) {
		return usageError{err}
	}
	return err
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return rootCmd(config.Default(), serve).ExecuteContext(ctx)
}

// rootCmd is the command line: flags bound to cfg, and serve run with the
// loaded configuration when no subcommand is given (tests pass their own
// serve to see what the command line loaded).
func rootCmd(cfg *config.Config, serve func(context.Context, *config.Config) error) *cobra.Command {
	root := &cobra.Command{
		Use:           "vgpud",
		Short:         "vgpud carves NVIDIA GPUs into MIG instances and vGPUs for libvirt VMs",
		Version:       version.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := loadConfig(cfg, cmd.Flags()); err != nil {
				return err
			}
			return serve(cmd.Context(), cfg)
		},
	}
	root.SetVersionTemplate("vgpud {{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	cfg.BindFlags(root.PersistentFlags())
	sim := simCmd(cfg)
	helpOnly(sim, root.HelpFunc(), simFlags)
	root.AddCommand(inventoryCmd(cfg), sim, genDocsCmd())
	return root
}

// simFlags are the daemon's flags that `vgpud sim` verbs read; their help
// lists only these.
var simFlags = map[string]bool{"config": true, "state-dir": true, "sim-host": true, "profiles-dir": true, "log-level": true, "help": true}

// helpOnly makes cmd's help (and its subcommands') list, of the flags it
// inherits, only those in keep: the others are accepted but say nothing
// about what cmd does.
func helpOnly(cmd *cobra.Command, help func(*cobra.Command, []string), keep map[string]bool) {
	cmd.SetHelpFunc(func(c *cobra.Command, args []string) {
		c.InheritedFlags().VisitAll(func(f *pflag.Flag) {
			if !keep[f.Name] {
				f.Hidden = true
			}
		})
		help(c, args)
	})
}
