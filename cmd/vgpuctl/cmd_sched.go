package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/spf13/cobra"

	"github.com/vgpud/vgpud/pkg/dbusapi"
)

// schedDoc is gpu scheduler's -o json/yaml document.
type schedDoc struct {
	header
	GPU string `json:"gpu"`
	// GPUInstance is the GPU instance whose scheduler it is (--gpu-instance);
	// nil for the GPU's own.
	GPUInstance *int          `json:"gpuInstance,omitempty"`
	Mode        string        `json:"mode"`
	Policy      string        `json:"policy,omitempty"`
	Timeslice   time.Duration `json:"timesliceNs,omitempty"`
	Pending     bool          `json:"pending"`
	Detail      string        `json:"detail,omitempty"`
}

func (a *app) gpuSchedulerCmd() *cobra.Command {
	var mode, policy string
	var timeslice time.Duration
	var gi int
	var clear bool
	cmd := &cobra.Command{
		Use:   "scheduler GPU [--gpu-instance N] [--policy POLICY [--timeslice DURATION]] [--mode pinned|adaptive] [--clear]",
		Short: "Pin a GPU's (or GPU instance's) vGPU scheduler policy and time slice, or hand it to the share loop",
		Long: `Pin the time-sliced vGPU scheduler of a GPU to a policy (best_effort,
equal_share or fixed_share) and time slice (--timeslice 2ms; the driver's
default when not given): the share loop then never changes it. --mode adaptive
hands the GPU back to the share loop, which chooses its policy. The setting is
kept across restarts of vgpud and set again after a host reboot, before VMs
start.

The driver takes a scheduler change only while no VM with a vGPU runs on the
GPU: while one runs, the setting is kept as pending (gpu show says so) and set
as soon as they stop. GPUs with MIG on have no time-sliced scheduler.

With --gpu-instance N (Blackwell GB20x, e.g. RTX PRO 6000 Blackwell, in MIG
mode) the setting is the scheduler of GPU instance N (gpu show lists them),
under which that GPU instance's vGPUs take turns. It is kept by the GPU
instance's profile and placement and set again on the GPU instance there when
it is re-created (a reboot, a reconcile) or the driver reloads. The driver takes
it only while no VM runs in the GPU instance (pending until then). --clear (or
--mode adaptive) drops the pin: the share loop steers the GPU instance's
scheduler again (where the driver allows it). vgpud drops the pin
itself when it destroys the GPU instance (its last vGPU destroyed) or turns MIG
off on the GPU. A pin whose GPU instance went otherwise (destroyed by hand)
stays pending, shown by gpu show with the id its GPU instance had; --clear
with that id drops it.`,
		Example: `  vgpuctl gpu scheduler 0000:81:00.0 --policy fixed_share --timeslice 2ms
  vgpuctl gpu scheduler 0000:81:00.0 --mode adaptive
  vgpuctl gpu scheduler 0000:c1:00.0 --gpu-instance 3 --policy equal_share --timeslice 5ms
  vgpuctl gpu scheduler 0000:c1:00.0 --gpu-instance 3 --clear`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeGPUs,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, args []string) error {
			if clear {
				if mode != "" || policy != "" || timeslice != 0 {
					return usagef("--clear drops the pin: give neither --mode, --policy nor --timeslice")
				}
				mode = "adaptive"
			}
			switch {
			case mode == "" && policy == "":
				return usagef("give --policy (best_effort, equal_share, fixed_share) to pin the scheduler, or --mode adaptive (--clear)")
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
			if cmd.Flags().Changed("gpu-instance") {
				if gi < 0 || gi > math.MaxInt32 {
					return usagef("--gpu-instance %d: give a GPU instance id (gpu show lists them)", gi)
				}
				return a.gpuInstanceScheduler(ctx, c, args[0], gi, mode, policy, timeslice)
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
	f.IntVar(&gi, "gpu-instance", 0, "the scheduler of this GPU instance (Blackwell GB20x in MIG mode), not the GPU's")
	f.BoolVar(&clear, "clear", false, "drop the pin (the same as --mode adaptive); with --gpu-instance also the pin of a GPU instance that is gone")
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
	what := "GPU " + d.GPU
	if d.GPUInstance != nil {
		what = fmt.Sprintf("GPU %s GPU instance %d", d.GPU, *d.GPUInstance)
	}
	switch {
	case d.Mode != "pinned" && d.GPUInstance != nil:
		_, err = fmt.Fprintf(w, "vGPU scheduler of %s is not pinned: the share loop steers it\n", what)
	case d.Mode != "pinned":
		_, err = fmt.Fprintf(w, "vGPU scheduler of %s is adaptive: the share loop chooses its policy\n", what)
	case d.Pending:
		_, err = fmt.Fprintf(w, "vGPU scheduler of %s pinned to %s\n  pending: %s\n", what, schedSetting(d.Policy, d.Timeslice), d.Detail)
	default:
		_, err = fmt.Fprintf(w, "vGPU scheduler of %s pinned to %s\n", what, schedSetting(d.Policy, d.Timeslice))
	}
	return err
}

// gpuInstanceScheduler is gpu scheduler --gpu-instance: the call, then
// what vgpud holds for that GPU instance.
func (a *app) gpuInstanceScheduler(ctx context.Context, c api, id string, gi int, mode, policy string, timeslice time.Duration) error {
	r, err := c.SetGPUInstanceScheduler(ctx, id, gi, mode, policy, timeslice)
	if err != nil {
		return err
	}
	doc := schedDoc{header: hdr("GPUInstanceScheduler"), GPU: id, GPUInstance: &gi, Mode: r.Mode, Pending: r.Pending, Detail: r.Detail}
	if r.Mode == "pinned" {
		doc.Policy, doc.Timeslice = normPolicy(policy), timeslice
		if g, err := c.GPU(ctx, id); err == nil {
			for _, s := range g.GPUInstanceSchedulers {
				if s.GPUInstance == gi && s.Mode == "pinned" {
					doc.Policy, doc.Timeslice = s.Policy, s.Timeslice
				}
			}
		}
	}
	return a.emit(doc, func(w io.Writer) error { return schedText(w, doc) })
}

// giSchedLines are gpu show's lines for the GPU instances' schedulers.
func giSchedLines(w io.Writer, ss []dbusapi.GPUInstanceScheduler) {
	for _, s := range ss {
		what := fmt.Sprintf("GPU instance %d", s.GPUInstance)
		if s.GPUInstance < 0 {
			what = fmt.Sprintf("GPU instance %s at %d (none there now)", dash(s.Profile), s.Start)
			if s.LastGPUInstance >= 0 {
				what = fmt.Sprintf("GPU instance %d, %s at %d (gone; --gpu-instance %d --clear drops its pin)", s.LastGPUInstance, dash(s.Profile), s.Start, s.LastGPUInstance)
			}
		}
		cell := "not pinned (the share loop steers it)"
		if s.Mode == "pinned" {
			cell = "pinned: " + schedSetting(s.Policy, s.Timeslice)
			if s.Pending {
				cell += ", pending"
			}
		}
		fmt.Fprintf(w, "  %s scheduler: %s\n", what, cell)
	}
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
