package metrics

import (
	"math"
	"sort"

	"github.com/vgpud/vgpud/pkg/share"
)

// collectShares emits the share loop's latest window: per-GPU telemetry
// and scheduler state, per-instance shares and counters, per-tenant sums.
func (c *Collector) collectShares(b *batch, s *share.Snapshot) {
	if s == nil || s.Windows == 0 {
		return
	}
	b.add("vgpud_share_window_seconds", s.Window.Seconds())
	b.add("vgpud_share_windows_total", float64(s.Windows))
	b.add("vgpud_share_poll_errors_total", float64(s.PollErrors))
	b.add("vgpud_share_last_window_timestamp_seconds", float64(s.Time.UnixNano())/1e9)
	for _, g := range s.GPUs {
		c.collectGPUShares(b, s, g)
	}
	for _, i := range s.Instances {
		l := b.inst(i.UUID, i.Tenant, i.GPU)
		b.add("vgpud_instance_active", boolf(i.Active), l...)
		b.add("vgpud_instance_entitled_share_ratio", i.Entitled, l...)
		b.add("vgpud_instance_achieved_share_ratio", i.Achieved, l...)
		b.add("vgpud_instance_demand_share_ratio", i.Demand, l...)
		b.add("vgpud_instance_interference_index", i.Interference, l...)
		b.add("vgpud_instance_utilization_ratio", i.Busy, l...)
		if i.HasUtil {
			b.add("vgpud_instance_sm_utilization_ratio", i.SMUtil, l...)
			b.add("vgpud_instance_memory_utilization_ratio", i.MemUtil, l...)
		}
		if i.HasFB {
			b.add("vgpud_instance_framebuffer_used_bytes", float64(i.FBUsed), l...)
		}
		b.add("vgpud_instance_scheduler_run_seconds_total", i.RunSeconds, l...)
		b.add("vgpud_instance_scheduler_preemptions_total", float64(i.Preemptions), l...)
		for _, r := range sortedKeys(i.ClockEventSeconds) {
			b.add("vgpud_instance_clock_event_seconds_total", i.ClockEventSeconds[r], b.inst(i.UUID, i.Tenant, i.GPU, r)...)
		}
	}
	for _, t := range s.Tenants {
		b.add("vgpud_tenant_entitled_gpus", t.Entitled, t.Tenant)
		b.add("vgpud_tenant_achieved_gpus", t.Achieved, t.Tenant)
		b.add("vgpud_tenant_demand_gpus", t.Demand, t.Tenant)
		if t.WorstInstance != "" {
			b.add("vgpud_tenant_worst_interference_index", t.Worst, t.Tenant, t.WorstInstance)
		}
	}
}

func (c *Collector) collectGPUShares(b *batch, s *share.Snapshot, g share.GPUShares) {
	id := b.gpu(g.UUID)
	b.add("vgpud_gpu_scheduler_supported", boolf(g.Supported), id...)
	mode := string(s.Mode)
	if g.Pinned {
		mode = "pinned" // an operator's policy, which the loop leaves alone
	}
	b.add("vgpud_gpu_scheduler_policy_info", 1, b.gpu(g.UUID, string(g.Policy), string(g.Desired), mode)...)
	b.add("vgpud_gpu_scheduler_policy_pending", boolf(g.Pending != nil), id...)
	if g.Supported {
		b.add("vgpud_gpu_scheduler_timeslice_seconds", g.Timeslice.Seconds(), id...)
		b.add("vgpud_gpu_scheduler_log_entries_total", float64(g.LogEntries), id...)
		b.add("vgpud_gpu_scheduler_log_overruns_total", float64(g.LogOverruns), id...)
		b.add("vgpud_gpu_scheduler_unmatched_run_seconds_total", g.UnmatchedRunSeconds, id...)
		b.add("vgpud_gpu_active_vgpus", float64(g.ActiveVGPUs), id...)
	}
	switches := make([][2]share.Policy, 0, len(g.Switches))
	for k := range g.Switches {
		switches = append(switches, k)
	}
	sort.Slice(switches, func(i, j int) bool {
		return switches[i][0] < switches[j][0] || switches[i][0] == switches[j][0] && switches[i][1] < switches[j][1]
	})
	for _, k := range switches {
		b.add("vgpud_gpu_scheduler_policy_switches_total", float64(g.Switches[k]), b.gpu(g.UUID, string(k[0]), string(k[1]))...)
	}
	for _, to := range sortedPolicies(g.Refusals) {
		for _, why := range sortedKeys(g.Refusals[to]) {
			b.add("vgpud_gpu_scheduler_policy_refusals_total", float64(g.Refusals[to][why]), b.gpu(g.UUID, string(to), why)...)
		}
	}
	if !math.IsNaN(g.Fairness) {
		b.add("vgpud_gpu_fairness_index", g.Fairness, id...)
	}
	for _, r := range sortedKeys(g.ClockEventSeconds) {
		b.add("vgpud_gpu_clock_event_seconds_total", g.ClockEventSeconds[r], b.gpu(g.UUID, r)...)
	}
	if g.SMMHz > 0 {
		b.add("vgpud_gpu_sm_clock_hertz", float64(g.SMMHz)*1e6, id...)
	}
	if !g.HasTelemetry {
		return
	}
	t := g.Telemetry
	if t.HasUtil {
		b.add("vgpud_gpu_utilization_ratio", t.Util, id...)
		b.add("vgpud_gpu_memory_utilization_ratio", t.MemUtil, id...)
	}
	b.add("vgpud_gpu_power_watts", t.PowerW, id...)
	b.add("vgpud_gpu_power_limit_watts", t.PowerLimitW, id...)
	if t.HasEnergy {
		b.add("vgpud_gpu_energy_joules_total", t.EnergyJ, id...)
	}
	b.add("vgpud_gpu_temperature_celsius", t.TemperatureC, id...)
	if t.SMMaxMHz > 0 {
		b.add("vgpud_gpu_sm_clock_max_hertz", float64(t.SMMaxMHz)*1e6, id...)
	}
	if t.MemTotal > 0 {
		b.add("vgpud_gpu_framebuffer_total_bytes", float64(t.MemTotal), id...)
		b.add("vgpud_gpu_framebuffer_used_bytes", float64(t.MemUse), id...)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sortedPolicies[V any](m map[share.Policy]V) []share.Policy {
	out := make([]share.Policy, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
