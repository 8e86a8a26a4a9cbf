// Package dashboards holds vgpud's Grafana dashboards as code (titles,
// panels, PromQL), and the Prometheus recording and alerting rules beside
// them (rules.yml, with promtool unit tests in rules_test.yml). `go
// generate ./dashboards` runs ./gen, which builds the dashboards' JSON
// with the Grafana Foundation SDK; tests fail when the files are stale or
// a panel queries a metric that vgpud does not export.
//
// Only the generator and tests import it (so the SDK stays out of the
// daemon).
//
// Imports: nothing from vgpud.
package dashboards

//go:generate go run ./gen

import (
	"regexp"
	"sort"
)

// Dashboard is one Grafana dashboard.
type Dashboard struct {
	UID, Title, File string
	Tags             []string
	// Vars are query variables ("gpu", "tenant") over label_values queries.
	Vars   []Var
	Panels []Panel
}

// Var is a dashboard variable: a multi-select of a label's values
// (Query label_values(metric, label)), or of series (Query
// query_result(expr), Regex picking each option's value and text out of
// a series with named groups).
type Var struct {
	Name, Label, Query, Regex string
}

// Panel is one panel; Targets are its PromQL queries.
type Panel struct {
	Title, Type, Unit, Description string
	W, H                           int
	Targets                        []Target
	// Table panels show instant queries as rows.
	Instant bool
	// Stack stacks time series.
	Stack bool
	Min   *float64
	Max   *float64
}

// Target is one query of a panel.
type Target struct {
	Expr, Legend string
}

func f(v float64) *float64 { return &v }

// gpuOptions lists the GPUs for the $gpu variable, one series each with
// a display label that joins what tells them apart on a host; the regex
// takes the UUID as the value and that label as the text (Grafana's
// named groups).
const (
	gpuOptions      = `query_result(label_join(vgpud_gpu_info, "gpu_display", " ", "gpu", "pci_bus_id", "model"))`
	gpuOptionsRegex = `/(?=.*UUID="(?<value>[^"]+)")(?=.*gpu_display="(?<text>[^"]+)")/`
)

// Exprs returns every query of the dashboard.
func (d Dashboard) Exprs() []string {
	var out []string
	for _, v := range d.Vars {
		out = append(out, v.Query)
	}
	for _, p := range d.Panels {
		for _, t := range p.Targets {
			out = append(out, t.Expr)
		}
	}
	return out
}

// All returns the dashboards.
func All() []Dashboard {
	return []Dashboard{hostOverview(), gpuDetail(), tenantView(), operations()}
}

func ts(title, unit string, w int, targets ...Target) Panel {
	return Panel{Title: title, Type: "timeseries", Unit: unit, W: w, H: 8, Targets: targets}
}

func stat(title, unit string, t Target) Panel {
	return Panel{Title: title, Type: "stat", Unit: unit, W: 4, H: 4, Targets: []Target{t}}
}

func table(title string, w, h int, targets ...Target) Panel {
	return Panel{Title: title, Type: "table", W: w, H: h, Targets: targets, Instant: true}
}

func hostOverview() Dashboard {
	return Dashboard{UID: "vgpud-host", Title: "vgpud: host overview", File: "host-overview.json", Tags: []string{"vgpud"},
		Panels: []Panel{
			stat("GPUs", "short", Target{Expr: `count(vgpud_gpu_info)`}),
			stat("Instances", "short", Target{Expr: `count(vgpud_instance_info) or vector(0)`}),
			stat("GPUs lost or failed", "short", Target{Expr: `sum(vgpud_gpu_lost) + sum(vgpud_gpu_failed)`}),
			stat("XID events (1h)", "short", Target{Expr: `sum(increase(vgpud_xid_events_total[1h]))`}),
			stat("Starved guaranteed instances", "short", Target{Expr: `count(vgpud_instance_interference_index > 0.3 and on(instance_uuid) vgpud_instance_entitled_share_ratio > 0) or vector(0)`}),
			stat("Collection age", "s", Target{Expr: `max(vgpud_collection_age_seconds)`}),
			{Title: "MIG slot map", Type: "table", W: 24, H: 10, Instant: true,
				Description: "Every MIG memory slice of every MIG GPU: which instance and tenant hold it (1), or free (0).",
				Targets:     []Target{{Expr: `vgpud_gpu_mig_slot_occupied * on(UUID) group_left(model) vgpud_gpu_info`}}},
			ts("GPU utilization", "percentunit", 12, Target{Expr: `vgpud_gpu_utilization_ratio`, Legend: "GPU {{gpu}} {{pci_bus_id}}"},
				Target{Expr: `sum by (gpu, UUID) (vgpud_instance_achieved_share_ratio * on(instance_uuid) group_left(kind) vgpud_instance_info{kind=~"mig|mig-vgpu"})`, Legend: "MIG GPU {{gpu}} (achieved)"}),
			ts("Power and limit", "watt", 12, Target{Expr: `vgpud_gpu_power_watts`, Legend: "GPU {{gpu}}"},
				Target{Expr: `vgpud_gpu_power_limit_watts`, Legend: "limit GPU {{gpu}}"}),
			ts("Framebuffer", "bytes", 12, Target{Expr: `sum(vgpud_gpu_framebuffer_total_bytes)`, Legend: "total"},
				Target{Expr: `sum(vgpud_gpu_framebuffer_allocated_bytes)`, Legend: "allocated"},
				Target{Expr: `sum(vgpud_gpu_framebuffer_used_bytes)`, Legend: "used"}),
			ts("Temperature", "celsius", 12, Target{Expr: `vgpud_gpu_temperature_celsius`, Legend: "GPU {{gpu}}"}),
			ts("Power against the limit", "percentunit", 12, Target{Expr: `vgpud:gpu_power_limit:ratio`, Legend: "GPU {{gpu}}"}),
			ts("Clock held back (5m)", "percentunit", 12, Target{Expr: `sum by (gpu) (vgpud:gpu_clock_event_seconds:rate5m{reason!="gpu_idle"})`, Legend: "GPU {{gpu}}"}),
			table("GPUs", 24, 8, Target{Expr: `vgpud_gpu_info * on(UUID) group_left(policy, desired, mode) vgpud_gpu_scheduler_policy_info`}),
		}}
}

func gpuDetail() Dashboard {
	// $gpu's values are UUIDs (stable across reboots, unlike the index);
	// its options read "index PCI-bus-id model".
	sel := `UUID=~"$gpu"`
	return Dashboard{UID: "vgpud-gpu", Title: "vgpud: GPU detail", File: "gpu-detail.json", Tags: []string{"vgpud"},
		Vars: []Var{{Name: "gpu", Label: "GPU", Query: gpuOptions, Regex: gpuOptionsRegex}},
		Panels: []Panel{
			table("Scheduler", 12, 6, Target{Expr: `vgpud_gpu_scheduler_policy_info{` + sel + `}`},
				Target{Expr: `vgpud_gpu_scheduler_policy_pending{` + sel + `}`}),
			ts("Policy switches and refusals", "short", 12,
				Target{Expr: `sum by (gpu, from, to) (increase(vgpud_gpu_scheduler_policy_switches_total{` + sel + `}[$__rate_interval])) or vector(0)`, Legend: "{{from}} -> {{to}}"},
				Target{Expr: `sum by (gpu, to, reason) (increase(vgpud_gpu_scheduler_policy_refusals_total{` + sel + `}[$__rate_interval])) or vector(0)`, Legend: "refused -> {{to}} ({{reason}})"}),
			{Title: "Achieved share by instance", Type: "timeseries", Unit: "percentunit", W: 12, H: 8, Stack: true, Min: f(0), Max: f(1),
				Targets: []Target{{Expr: `vgpud_instance_achieved_share_ratio{` + sel + `}`, Legend: "{{tenant}} {{instance_uuid}}"}}},
			ts("Interference index", "percentunit", 12, Target{Expr: `vgpud_instance_interference_index{` + sel + `}`, Legend: "{{tenant}} {{instance_uuid}}"}),
			ts("Fairness (Jain)", "short", 8, Target{Expr: `vgpud_gpu_fairness_index{` + sel + `}`, Legend: "GPU {{gpu}}"}),
			ts("Clock events", "percentunit", 8, Target{Expr: `rate(vgpud_gpu_clock_event_seconds_total{` + sel + `}[$__rate_interval]) > 0`, Legend: "{{reason}}"}),
			ts("SM clock", "hertz", 8, Target{Expr: `vgpud_gpu_sm_clock_hertz{` + sel + `}`, Legend: "now"},
				Target{Expr: `vgpud_gpu_sm_clock_max_hertz{` + sel + `}`, Legend: "max"}),
			ts("Power", "watt", 8, Target{Expr: `vgpud_gpu_power_watts{` + sel + `}`, Legend: "draw"},
				Target{Expr: `vgpud_gpu_power_limit_watts{` + sel + `}`, Legend: "limit"},
				Target{Expr: `rate(vgpud_gpu_energy_joules_total{` + sel + `}[$__rate_interval])`, Legend: "from energy"}),
			ts("Scheduler runs", "percentunit", 8, Target{Expr: `rate(vgpud_instance_scheduler_run_seconds_total{` + sel + `}[$__rate_interval])`, Legend: "{{instance_uuid}}"}),
			ts("Preemptions per second", "short", 8, Target{Expr: `rate(vgpud_instance_scheduler_preemptions_total{` + sel + `}[$__rate_interval])`, Legend: "{{instance_uuid}}"}),
			ts("Scheduler log", "short", 12, Target{Expr: `rate(vgpud_gpu_scheduler_log_entries_total{` + sel + `}[$__rate_interval])`, Legend: "entries/s"},
				Target{Expr: `increase(vgpud_gpu_scheduler_log_overruns_total{` + sel + `}[$__rate_interval])`, Legend: "overruns"}),
			ts("Framebuffer by instance", "bytes", 12, Target{Expr: `vgpud_instance_framebuffer_used_bytes{` + sel + `}`, Legend: "used {{instance_uuid}}"},
				Target{Expr: `vgpud_instance_framebuffer_total_bytes{` + sel + `}`, Legend: "size {{instance_uuid}}"}),
			ts("Instance utilization", "percentunit", 12, Target{Expr: `vgpud_instance_utilization_ratio{` + sel + `}`, Legend: "busy {{instance_uuid}}"},
				Target{Expr: `vgpud_instance_sm_utilization_ratio{` + sel + `}`, Legend: "SM {{instance_uuid}}"},
				Target{Expr: `vgpud_instance_memory_utilization_ratio{` + sel + `}`, Legend: "memory {{instance_uuid}}"}),
			table("Instances", 24, 8, Target{Expr: `vgpud_instance_info{` + sel + `}`}),
		}}
}

func tenantView() Dashboard {
	sel := `tenant=~"$tenant"`
	return Dashboard{UID: "vgpud-tenant", Title: "vgpud: tenants", File: "tenant-view.json", Tags: []string{"vgpud"},
		Vars: []Var{{Name: "tenant", Label: "Tenant", Query: `label_values(vgpud_tenant_info, tenant)`}},
		Panels: []Panel{
			ts("Entitled vs achieved compute", "short", 12,
				Target{Expr: `vgpud_tenant_entitled_gpus{` + sel + `}`, Legend: "entitled {{tenant}}"},
				Target{Expr: `vgpud_tenant_achieved_gpus{` + sel + `}`, Legend: "achieved {{tenant}}"},
				Target{Expr: `vgpud_tenant_demand_gpus{` + sel + `}`, Legend: "demand {{tenant}}"}),
			ts("Achieved, 5m average", "short", 12, Target{Expr: `vgpud:tenant_achieved_gpus:avg5m{` + sel + `}`, Legend: "{{tenant}}"}),
			ts("Worst interference", "percentunit", 12, Target{Expr: `max by (tenant) (vgpud_tenant_worst_interference_index{` + sel + `})`, Legend: "{{tenant}}"},
				Target{Expr: `max by (tenant) (vgpud:instance_interference_index:max5m{` + sel + `})`, Legend: "5m max {{tenant}}"}),
			ts("Interference by instance", "percentunit", 12, Target{Expr: `vgpud_instance_interference_index{` + sel + `}`, Legend: "{{instance_uuid}}"}),
			ts("Shortfall (entitled - achieved)", "short", 12, Target{Expr: `vgpud:tenant_shortfall_gpus{` + sel + `}`, Legend: "{{tenant}}"}),
			ts("Entitled vs achieved by instance", "percentunit", 12,
				Target{Expr: `vgpud_instance_entitled_share_ratio{` + sel + `}`, Legend: "entitled {{instance_uuid}}"},
				Target{Expr: `vgpud_instance_achieved_share_ratio{` + sel + `}`, Legend: "achieved {{instance_uuid}}"}),
			ts("Throttled while running", "percentunit", 12, Target{Expr: `sum by (instance_uuid, reason) (rate(vgpud_instance_clock_event_seconds_total{` + sel + `}[$__rate_interval]))`, Legend: "{{instance_uuid}} {{reason}}"}),
			table("Tenants", 12, 6, Target{Expr: `vgpud_tenant_info{` + sel + `}`}, Target{Expr: `vgpud_tenant_instances{` + sel + `}`}),
			ts("Framebuffer held", "bytes", 12, Target{Expr: `vgpud_tenant_framebuffer_allocated_bytes{` + sel + `}`, Legend: "{{tenant}}"}),
		}}
}

func operations() Dashboard {
	return Dashboard{UID: "vgpud-ops", Title: "vgpud: operations", File: "operations.json", Tags: []string{"vgpud"},
		Panels: []Panel{
			ts("Operations", "ops", 12, Target{Expr: `vgpud:operations:rate5m`, Legend: "{{op}} {{outcome}}"}),
			ts("Operation duration p50 / p95", "s", 12,
				Target{Expr: `histogram_quantile(0.5, sum by (le, op) (rate(vgpud_operation_duration_seconds_bucket[$__rate_interval])))`, Legend: "p50 {{op}}"},
				Target{Expr: `histogram_quantile(0.95, sum by (le, op) (rate(vgpud_operation_duration_seconds_bucket[$__rate_interval])))`, Legend: "p95 {{op}}"}),
			table("Operations by outcome", 12, 6, Target{Expr: `sum by (op, outcome) (vgpud_operations_total)`}),
			ts("Failed operations", "short", 12, Target{Expr: `sum by (op) (increase(vgpud_operations_total{outcome="failure"}[$__rate_interval]))`, Legend: "{{op}}"}),
			ts("NVML call latency p99", "s", 12, Target{Expr: `vgpud:nvml_call_duration_seconds:p99_5m`, Legend: "{{op}}"}),
			ts("NVML errors", "short", 12, Target{Expr: `sum by (op, code) (rate(vgpud_nvml_call_errors_total[$__rate_interval]))`, Legend: "{{op}} {{code}}"}),
			ts("Collection", "s", 12, Target{Expr: `vgpud_collection_duration_seconds`, Legend: "duration"},
				Target{Expr: `vgpud_collection_age_seconds`, Legend: "age"},
				Target{Expr: `vgpud_collector_duration_seconds`, Legend: "{{collector}}"}),
			ts("Collectors and share loop", "short", 12, Target{Expr: `vgpud_collector_success`, Legend: "{{collector}} ok"},
				Target{Expr: `rate(vgpud_share_windows_total[$__rate_interval])`, Legend: "windows/s"},
				Target{Expr: `rate(vgpud_share_poll_errors_total[$__rate_interval])`, Legend: "poll errors/s"}),
			ts("XID events", "short", 12, Target{Expr: `sum by (gpu, xid) (increase(vgpud_xid_events_total[$__rate_interval]))`, Legend: "GPU {{gpu}} XID {{xid}}"}),
			table("XID events in the last hour", 12, 6, Target{Expr: `sum by (gpu) (vgpud:xid_events:increase1h)`}),
			ts("GPU lost events", "short", 12, Target{Expr: `sum by (gpu) (increase(vgpud_gpu_lost_events_total[$__rate_interval]))`, Legend: "GPU {{gpu}}"}),
		}}
}

// metricRef finds metric and recording-rule names in a query.
var metricRef = regexp.MustCompile(`\bvgpud[_:][A-Za-z0-9_:]*`)

// Metrics returns the vgpud metric and recording-rule names expr uses.
func Metrics(expr string) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range metricRef.FindAllString(expr, -1) {
		if !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	sort.Strings(out)
	return out
}
