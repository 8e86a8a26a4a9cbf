#!/usr/bin/env bash
# Read-only checks against a real NVIDIA GPU: builds vgpud, prints the
# host inventory as vgpud discovers it, and compares NVML's MIG profile
# tables with profiles/, and reads the scheduler state and log of each GPU
# and of each GPU instance (the per-GPU-instance scheduler of Blackwell
# GB20x, NOT_SUPPORTED elsewhere) through the _v2 calls. It changes no GPU setting (no MIG mode change,
# no reset, no instance created). Output goes to $OUT (default ./real-gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations"
out=${OUT:-real-gpu}
mkdir -p "$out"
go build -o bin/ ./cmd/vgpud
nvidia-smi -L > "$out/nvidia-smi-L.txt" 2>&1 || true
nvidia-smi mig -lgip > "$out/nvidia-smi-lgip.txt" 2>&1 || true
nvidia-smi mig -lgipp > "$out/nvidia-smi-lgipp.txt" 2>&1 || true
bin/vgpud inventory --state-dir "$(mktemp -d)" -o json > "$out/inventory.json" 2> "$out/inventory.err" || true
bin/vgpud inventory --state-dir "$(mktemp -d)" -o table > "$out/inventory.txt" 2>&1 || true
go test -count=1 -run 'TestRealGPU$' -v ./pkg/gpu/nvml/ -args -real-gpu 2>&1 | tee "$out/catalog-check.txt"
go test -count=1 -run 'TestRealGPUCurrentCalls$' -v ./pkg/gpu/nvml/ -args -real-gpu 2>&1 | tee "$out/current-calls.txt"
