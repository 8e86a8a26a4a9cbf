package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/vgpud/vgpud/pkg/dbusapi"
)

// schedDoc is gpu scheduler's -o json/yaml document.
type schedDoc struct {
	header
	GPU       string        `json:"gpu"`
	Mode      string        `json:"mode"`
	Policy    string        `json:"policy,omitempty"`
	Timeslice time.Duration `json:"timesliceNs,omitempty"`
	Pending   bool          `json:"pending"`
	Detail    string        `json:"detail,omitempty"`
}

func (a *app) gpuSchedulerCmd() *cobra.Command {
	var mode, policy string
	var timeslice time.Duration
	cmd := &cobra.Command{
		Use:   "scheduler GPU [--policy POLICY [--timeslice DURATION]] [--mode pinned|adaptive]",
		Short: "Pin a GPU's vGPU scheduler policy and time slice, or hand it to the share loop",
		Long: `Pin the time-sliced vGPU scheduler of a GPU to a policy (best_effort,
equal_share or fixed_share) and time slice (--timeslice 2ms; the driver's
default when not given): the share loop then never changes it. --mode adaptive
hands the GPU back to the share loop, which chooses its policy. The setting is
kept across restarts of vgpud and set again after a host reboot, before VMs
start.

The driver takes a scheduler change only while no VM with a vGPU runs on the
GPU: while one runs, the setting is kept as pending (gpu show says so) and set
as soon as they stop. GPUs with MIG on have no time-sliced scheduler.`,
		Example: `  vgpuctl gpu scheduler 0000:81:00.0 --policy fixed_share --timeslice 2ms
  vgpuctl gpu scheduler 0000:81:00.0 --mode adaptive`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeGPUs,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, args []string) error {
			switch {
			case mode == "" && policy == "":
				return usagef("give --policy (best_effort, equal_share, fixed_share) to pin the scheduler, or --mode adaptive")
			case mode != "" && mode != "pinned" && mode != "adaptive":
				return usagef("--mode %q: want pinned or adaptive", mode)
			case mode == "adaptive" && (policy != "" || timeslice != 0):
				return usagef("--mode adaptive lets the share loop choose the policy: give neither --policy nor --timeslice")
			case mode == "pinned" && policy == "":
				return usagef("--mode pinned needs --policy")
			case timeslice < 0:
				return usagef("--timeslice %v: must not be negative", timeslice)
			case timeslice%time.Microsecond != 0:
				// The API carries whole microseconds: a finer slice would
				// be cut short on the way, not refused.
				return usagef("--timeslice %v: give whole microseconds (1ms..30ms; 0s keeps the driver's)", timeslice)
			}
			r, err := c.SetGPUScheduler(ctx, args[0], mode, policy, timeslice)
			if err != nil {
				return err
			}
			doc := schedDoc{header: hdr("GPUScheduler"), GPU: args[0], Mode: r.Mode, Pending: r.Pending, Detail: r.Detail}
			if r.Mode == "pinned" {
				doc.Policy, doc.Timeslice = normPolicy(policy), timeslice
				// Show what vgpud holds (the driver's value, read back
				// after the set), not what was asked.
				if g, err := c.GPU(ctx, args[0]); err == nil && g.Scheduler != nil && g.Scheduler.Mode == "pinned" {
					doc.Policy, doc.Timeslice = g.Scheduler.Policy, g.Scheduler.Timeslice
				}
			}
			return a.emit(doc, func(w io.Writer) error { return schedText(w, doc) })
		}),
	}
	f := cmd.Flags()
	f.StringVar(&policy, "policy", "", "best_effort, equal_share or fixed_share (pins the GPU)")
	f.DurationVar(&timeslice, "timeslice", 0, "time slice set with the policy, 1ms..30ms in whole microseconds, e.g. 2ms; 0s keeps the driver's")
	f.StringVar(&mode, "mode", "", "pinned (the default with --policy) or adaptive (the share loop chooses)")
	_ = cmd.RegisterFlagCompletionFunc("policy", cobra.FixedCompletions([]string{"best_effort", "equal_share", "fixed_share"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("mode", cobra.FixedCompletions([]string{"pinned", "adaptive"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// normPolicy spells a policy as the API does (best-effort → best_effort).
func normPolicy(p string) string {
	out := []byte(p)
	for i, c := range out {
		if c == '-' {
			out[i] = '_'
		}
	}
	return string(out)
}

func schedText(w io.Writer, d schedDoc) error {
	var err error
	switch {
	case d.Mode != "pinned":
		_, err = fmt.Fprintf(w, "vGPU scheduler of GPU %s is adaptive: the share loop chooses its policy\n", d.GPU)
	case d.Pending:
		_, err = fmt.Fprintf(w, "vGPU scheduler of GPU %s pinned to %s\n  pending: %s\n", d.GPU, schedSetting(d.Policy, d.Timeslice), d.Detail)
	default:
		_, err = fmt.Fprintf(w, "vGPU scheduler of GPU %s pinned to %s\n", d.GPU, schedSetting(d.Policy, d.Timeslice))
	}
	return err
}

func schedSetting(policy string, ts time.Duration) string {
	if ts == 0 {
		return policy + " (the driver's time slice)"
	}
	return fmt.Sprintf("%s, time slice %v", policy, ts)
}

// schedCell is gpu show's Scheduler line.
func schedCell(s *dbusapi.GPUSchedulerState) string {
	switch {
	case s == nil:
		return "-"
	case s.Mode != "pinned":
		return "adaptive (the share loop chooses)"
	case s.Pending:
		return "pinned: " + schedSetting(s.Policy, s.Timeslice) + ", pending until the GPU's VMs stop"
	}
	return "pinned: " + schedSetting(s.Policy, s.Timeslice)
}
