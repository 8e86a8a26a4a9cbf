package metrics

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"
)

// family is one metric family the snapshot collectors emit.
type family struct {
	name   string
	help   string
	typ    prometheus.ValueType
	labels []string
}

const counterType = prometheus.CounterValue

// snapshotFamilies are the families built from the collected snapshot at
// each collection. The observed families (histograms and event counters,
// updated as things happen) are in observed.go; FamilyNames lists both.
func snapshotFamilies() []family {
	g, c := prometheus.GaugeValue, prometheus.CounterValue
	// GPU families carry dcgm-exporter's labels for the same GPU, instance
	// families the GPU's index and UUID (docs/metrics.md, joins).
	gpu := []string{"gpu", "UUID", "pci_bus_id"}
	gpuAnd := func(more ...string) []string { return append(append([]string(nil), gpu...), more...) }
	inst := []string{"instance_uuid", "tenant", "gpu", "UUID"}
	return []family{
		{"vgpud_build_info", "vgpud's version and Go version; always 1.", g, []string{"version", "goversion"}},
		{"vgpud_host_info", "The host: name, NVIDIA driver and NVML versions, whether it is simulated; always 1.", g, []string{"hostname", "driver_version", "nvml_version", "simulated"}},

		{"vgpud_gpu_info", "A GPU's identity (gpu: NVML index, UUID, pci_bus_id as dcgm-exporter labels them), model and modes; always 1.", g, gpuAnd("model", "product", "mig", "flavour")},
		{"vgpud_gpu_lost", "1 when the GPU fell off the bus (NVML GPU_IS_LOST, XID 79), else 0.", g, gpu},
		{"vgpud_gpu_failed", "1 when vgpud refuses new instances on the GPU after an XID or fault, else 0.", g, gpu},
		{"vgpud_gpu_framebuffer_total_bytes", "The GPU's framebuffer as NVML reports it.", g, gpu},
		{"vgpud_gpu_framebuffer_allocated_bytes", "Framebuffer held by vgpud's instances on the GPU (their profiles' sizes).", g, gpu},
		{"vgpud_gpu_framebuffer_used_bytes", "Framebuffer in use on the GPU as NVML reports it.", g, gpu},
		{"vgpud_gpu_utilization_ratio", "Fraction of the last second the GPU was busy (absent with MIG on, where NVML does not report it).", g, gpu},
		{"vgpud_gpu_memory_utilization_ratio", "Fraction of the last second the GPU's memory was busy (absent with MIG on).", g, gpu},
		{"vgpud_gpu_power_watts", "The GPU's power draw.", g, gpu},
		{"vgpud_gpu_power_limit_watts", "The power limit in force on the GPU.", g, gpu},
		{"vgpud_gpu_energy_joules_total", "Energy the GPU drew since the driver loaded.", c, gpu},
		{"vgpud_gpu_temperature_celsius", "The GPU's die temperature.", g, gpu},
		{"vgpud_gpu_sm_clock_hertz", "The GPU's SM clock at the last poll.", g, gpu},
		{"vgpud_gpu_sm_clock_max_hertz", "The GPU's maximum SM clock.", g, gpu},
		{"vgpud_gpu_clock_event_seconds_total", "Time each NVML clock event reason was raised on the GPU (sampled at each share-loop read of the GPU: every 200 ms on a time-sliced GPU running vGPUs, once a window on a MIG or idle GPU; each sample counts for the time since the previous one).", c, gpuAnd("reason")},
		{"vgpud_gpu_scheduler_supported", "1 when the GPU has a device-level vGPU scheduler; 0 when NVML answers NOT_SUPPORTED (MIG on, no vGPU manager).", g, gpu},
		{"vgpud_gpu_scheduler_policy_info", "The GPU's vGPU scheduler policy now and the one the share loop wants, with the loop's mode; always 1.", g, gpuAnd("policy", "desired", "mode")},
		{"vgpud_gpu_scheduler_timeslice_seconds", "The vGPU scheduler's time slice (0: the driver's default).", g, gpu},
		{"vgpud_gpu_scheduler_policy_pending", "1 while a policy switch waits for the driver (it refuses changes while VMs with vGPUs run), else 0.", g, gpu},
		{"vgpud_gpu_scheduler_policy_switches_total", "Scheduler policy switches the driver took.", c, gpuAnd("from", "to")},
		{"vgpud_gpu_scheduler_policy_refusals_total", "Scheduler policy switch attempts the driver refused, by reason (not_supported: VMs were running).", c, gpuAnd("to", "reason")},
		{"vgpud_gpu_scheduler_log_entries_total", "vGPU scheduler log entries read.", c, gpu},
		{"vgpud_gpu_scheduler_log_overruns_total", "Scheduler log reads that found entries lost because the driver's 200-entry ring wrapped.", c, gpu},
		{"vgpud_gpu_scheduler_unmatched_run_seconds_total", "Run time in the vGPU scheduler log that no instance got: runlists that were no running vGPU's handle, and running vGPUs that match no instance.", c, gpu},
		{"vgpud_gpu_instance_scheduler_info", "The vGPU scheduler of a GPU instance that hosts vGPUs (Blackwell GB20x: its vGPUs take turns under it): mode pinned (an operator's policy, set again after the GPU instance is re-created or the driver reloads) or adaptive (not pinned: the share loop steers it where the driver allows), with the pinned policy; always 1.", g, gpuAnd("GPU_I_ID", "GPU_I_PROFILE", "mode", "policy")},
		{"vgpud_gpu_instance_scheduler_timeslice_seconds", "The pinned time slice of a GPU instance's vGPU scheduler (0: the driver's default); absent when not pinned.", g, gpuAnd("GPU_I_ID")},
		{"vgpud_gpu_instance_scheduler_pending", "1 while a GPU instance's pinned scheduler waits for the driver (it refuses a change while a VM runs in the GPU instance), else 0; absent when not pinned.", g, gpuAnd("GPU_I_ID")},
		{"vgpud_gpu_fairness_index", "Jain's fairness index over the GPU's active instances' normalised shares (1 = fair).", g, gpu},
		{"vgpud_gpu_active_vgpus", "vGPUs VMs have open on the GPU.", g, gpu},
		{"vgpud_gpu_mig_slot_occupied", "Per MIG memory slice: 1 when an instance holds it (with its labels), 0 when free.", g, gpuAnd("slot", "instance_uuid", "tenant", "profile")},

		{"vgpud_instance_info", "An instance's identity for joins on instance_uuid, and on UUID and GPU_I_ID with dcgm-exporter's MIG series; always 1. (Prometheus keeps the label instance for the scrape target.)", g, []string{"instance_uuid", "tenant", "gpu", "UUID", "pci_bus_id", "GPU_I_ID", "GPU_I_PROFILE", "kind", "profile", "vm", "state"}},
		{"vgpud_instance_active", "1 when the instance ran in the last window (its VM has the vGPU open, or its MIG instance was measured).", g, inst},
		{"vgpud_instance_framebuffer_total_bytes", "The instance's framebuffer (its profile's size).", g, inst},
		{"vgpud_instance_framebuffer_used_bytes", "Framebuffer the instance's guest uses.", g, inst},
		{"vgpud_instance_utilization_ratio", "Fraction of the last window the instance ran (time-sliced) or its slices were busy (MIG).", g, inst},
		{"vgpud_instance_sm_utilization_ratio", "NVML's SM utilization of the instance (time-sliced: of the GPU; MIG: of its slices, from GPM).", g, inst},
		{"vgpud_instance_memory_utilization_ratio", "NVML's memory utilization of the instance (time-sliced: of the GPU; MIG: DRAM bandwidth of its slices).", g, inst},
		{"vgpud_instance_entitled_share_ratio", "Share of its GPU the instance is entitled to (guaranteed tenants' compute share; 0 for best-effort).", g, inst},
		{"vgpud_instance_achieved_share_ratio", "Share of its GPU's full-clock compute the instance received in the last window.", g, inst},
		{"vgpud_instance_demand_share_ratio", "Estimated share of its GPU the instance wanted in the last window (a lower bound when it was saturated).", g, inst},
		{"vgpud_instance_interference_index", "max(0, 1 - achieved/min(demand, entitled)) over the last window; 0 is perfect isolation.", g, inst},
		{"vgpud_instance_scheduler_run_seconds_total", "Time the instance ran on its GPU (scheduler log; MIG: busy slice time).", c, inst},
		{"vgpud_instance_scheduler_preemptions_total", "Runs the vGPU scheduler ended at the slice end with work left.", c, inst},
		{"vgpud_instance_clock_event_seconds_total", "Time the instance ran while its GPU's clocks were held back, by NVML clock event reason.", c, append(append([]string(nil), inst...), "reason")},

		{"vgpud_tenant_info", "A tenant's scheduling class; always 1.", g, []string{"tenant", "class"}},
		{"vgpud_tenant_instances", "Instances the tenant holds.", g, []string{"tenant"}},
		{"vgpud_tenant_framebuffer_allocated_bytes", "Framebuffer the tenant's instances hold.", g, []string{"tenant"}},
		{"vgpud_tenant_entitled_gpus", "Sum of the tenant's active instances' entitled shares, in GPUs.", g, []string{"tenant"}},
		{"vgpud_tenant_achieved_gpus", "Sum of the tenant's active instances' achieved shares, in GPUs.", g, []string{"tenant"}},
		{"vgpud_tenant_demand_gpus", "Sum of the tenant's active instances' demand estimates, in GPUs.", g, []string{"tenant"}},
		{"vgpud_tenant_worst_interference_index", "The highest interference index among the tenant's active instances, and which instance.", g, []string{"tenant", "instance_uuid"}},

		{"vgpud_share_window_seconds", "Length of the share loop's last window.", g, nil},
		{"vgpud_share_windows_total", "Windows the share loop closed.", c, nil},
		{"vgpud_share_poll_errors_total", "Driver reads the share loop found failing.", c, nil},
		{"vgpud_share_last_window_timestamp_seconds", "When the share loop's last window ended (Unix time).", g, nil},

		{"vgpud_collector_success", "1 when the collector's last run succeeded.", g, []string{"collector"}},
		{"vgpud_collector_duration_seconds", "How long the collector's last run took.", g, []string{"collector"}},
		{"vgpud_collection_duration_seconds", "How long the last collection took.", g, nil},
		{"vgpud_collection_last_success_timestamp_seconds", "When the last collection finished (Unix time).", g, nil},
		{"vgpud_collections_total", "Collections run.", c, nil},
	}
}

// ageFamily is added at each scrape (Gather): it is the only value that
// is not from the collection.
const ageFamily = "vgpud_collection_age_seconds"

// FamilyNames lists every vgpud_ metric name /metrics can carry, with
// histograms' _bucket, _sum and _count series (and the bare name of the
// native one, as a protobuf scrape stores it), sorted. Dashboards and
// rules are checked against it.
func FamilyNames() []string {
	var out []string
	for _, f := range snapshotFamilies() {
		out = append(out, f.name)
	}
	for _, f := range observedFamilies() {
		if f.native {
			out = append(out, f.name)
		}
		if f.histogram {
			out = append(out, f.name+"_bucket", f.name+"_sum", f.name+"_count")
		} else {
			out = append(out, f.name)
		}
	}
	out = append(out, ageFamily)
	sort.Strings(out)
	return out
}
