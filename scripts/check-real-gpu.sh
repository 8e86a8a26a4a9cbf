#!/usr/bin/env bash
# Read-only checks against a real NVIDIA GPU: builds vgpud, prints the
# host inventory as vgpud discovers it, and compares NVML's MIG profile
# tables with profiles/, and reads the scheduler state and log of each GPU
# and of each GPU instance (the per-GPU-instance scheduler of Blackwell
# GB20x, NOT_SUPPORTED elsewhere) through the _v2 calls. It also records
# what a MIG mode change carried through a GPU reset depends on: each
# GPU's MIG mode now and pending, the driver's reset status, its SR-IOV
# VFs (sriov_totalvfs, sriov_numvfs), the PCI reset methods the kernel
# offers, the vGPUs that run, and the processes that hold the driver's
# device nodes open (NVML sessions among them).
#
# It changes no GPU setting: no MIG mode change, no reset, no VF change,
# no instance created, no scheduler set; every command below only reads.
# vgpud's own GPU reset (the NVML backend's Resetter, which a MIG mode
# change of the daemon runs) is never reached from here: `vgpud inventory`
# and the -real-gpu tests only read.
# Without an NVIDIA GPU and driver (no nvidia-smi, or it lists no GPU) it
# says so and exits 0. Output goes to $OUT (default ./real-gpu).
# NVIDIA_SMI names the nvidia-smi to use (default: nvidia-smi on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
smi=${NVIDIA_SMI:-nvidia-smi}
if ! command -v "$smi" >/dev/null 2>&1 || ! "$smi" -L 2>/dev/null | grep -q '^GPU '; then
	echo "check-real-gpu: no NVIDIA GPU or driver on this host ($smi absent, or it lists no GPU): skipped"
	exit 0
fi
export PATH=/usr/local/go/bin:$PATH CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations"
out=${OUT:-real-gpu}
mkdir -p "$out"
go build -o bin/ ./cmd/vgpud
"$smi" -L > "$out/nvidia-smi-L.txt" 2>&1 || true
"$smi" mig -lgip > "$out/nvidia-smi-lgip.txt" 2>&1 || true
"$smi" mig -lgipp > "$out/nvidia-smi-lgipp.txt" 2>&1 || true

# MIG mode now and pending (a change the driver takes only at a reset
# shows as pending), and the driver's own reset status; a driver that
# lacks a field answers so in the file.
"$smi" --query-gpu=index,pci.bus_id,name,mig.mode.current,mig.mode.pending --format=csv > "$out/mig-mode.csv" 2>&1 || true
"$smi" --query-gpu=index,pci.bus_id,reset_status.reset_required,reset_status.drain_and_reset_recommended --format=csv > "$out/reset-status.csv" 2>&1 || true
# The vGPUs that run (a running vGPU makes the driver refuse a reset).
"$smi" vgpu > "$out/nvidia-smi-vgpu.txt" 2>&1 || true

# read prints a sysfs attribute, or "-" when the kernel has none.
read_attr() {
	if [[ -r $1 ]]; then
		tr '\n' ' ' < "$1" | sed 's/ *$//'
	else
		echo -n "-"
	fi
}

# Each NVIDIA physical function (vendor 0x10de, display or 3D class; VFs,
# which have a physfn link, left out): its SR-IOV VFs and how the kernel
# would reset it. Only reads.
{
	printf '%-14s %-8s %-10s %-10s %-12s %-6s %s\n' PCI driver totalvfs numvfs reset_method reset vf_drivers
	for dev in /sys/bus/pci/devices/*; do
		[[ $(read_attr "$dev/vendor") == 0x10de ]] || continue
		[[ $(read_attr "$dev/class") == 0x03* ]] || continue
		[[ -e $dev/physfn ]] && continue
		pci=$(basename "$dev")
		drv=-
		[[ -L $dev/driver ]] && drv=$(basename "$(readlink "$dev/driver")")
		reset=no
		[[ -e $dev/reset ]] && reset=yes
		vfdrv=$(for vf in "$dev"/virtfn*; do
			[[ -L $vf/driver ]] && basename "$(readlink "$vf/driver")"
		done 2>/dev/null | sort | uniq -c | awk '{printf "%s×%s ", $2, $1}')
		printf '%-14s %-8s %-10s %-10s %-12s %-6s %s\n' "$pci" "$drv" "$(read_attr "$dev/sriov_totalvfs")" \
			"$(read_attr "$dev/sriov_numvfs")" "$(read_attr "$dev/reset_method" | tr ' ' ',')" "$reset" "${vfdrv:--}"
	done
} > "$out/reset-readiness.txt" 2>&1 || true

# The processes that hold the driver's device nodes open (each NVML
# session holds /dev/nvidiactl and its GPUs' /dev/nvidiaN; the driver
# refuses a reset, and sriov-manage -d its unbind, while one is open),
# with each GPU's device minor from the driver's /proc. Only reads
# /proc; other users' processes need root to be seen.
{
	echo "# GPU -> device minor (/proc/driver/nvidia/gpus/*/information)"
	for info in /proc/driver/nvidia/gpus/*/information; do
		[[ -r $info ]] || continue
		echo "$(basename "$(dirname "$info")") $(awk -F: '/Device Minor/ {gsub(/ /, "", $2); print "/dev/nvidia" $2}' "$info")"
	done
	echo "# pid comm device"
	for fd in /proc/[0-9]*/fd/*; do
		target=$(readlink "$fd" 2>/dev/null) || continue
		case $target in
		/dev/nvidia[0-9]* | /dev/nvidiactl | /dev/nvidia-vgpu*) ;;
		*) continue ;;
		esac
		pid=${fd#/proc/}
		pid=${pid%%/*}
		echo "$pid $(cat "/proc/$pid/comm" 2>/dev/null || echo -) $target"
	done | sort -u
} > "$out/nvml-holders.txt" 2>&1 || true

bin/vgpud inventory --state-dir "$(mktemp -d)" -o json > "$out/inventory.json" 2> "$out/inventory.err" || true
bin/vgpud inventory --state-dir "$(mktemp -d)" -o table > "$out/inventory.txt" 2>&1 || true
go test -count=1 -run 'TestRealGPU$' -v ./pkg/gpu/nvml/ -args -real-gpu 2>&1 | tee "$out/catalog-check.txt"
go test -count=1 -run 'TestRealGPUCurrentCalls$' -v ./pkg/gpu/nvml/ -args -real-gpu 2>&1 | tee "$out/current-calls.txt"
go test -count=1 -run 'TestRealGPUResetReadiness$' -v ./pkg/gpu/nvml/ -args -real-gpu 2>&1 | tee "$out/reset-readiness-nvml.txt"
