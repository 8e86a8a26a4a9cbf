#!/usr/bin/env bash
# The vgpud demo: the whole story on the built-in simulated GPU host,
# driven with vgpuctl over a private D-Bus system bus, with a real libvirtd
# for the VMs when it is installed. Everything lives in a temporary
# directory and is stopped at the end.
#
#   make demo            (builds, installs dependencies, runs this)
#   KEEP=1 make demo     leaves vgpud running and prints how to reach it
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export PATH=/usr/local/go/bin:$root/bin:$PATH

work=$(mktemp -d /tmp/vgpud-demo.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
  [ -n "${KEEP:-}" ] && return
  if [ -n "${LIBVIRT_OWNED:-}" ]; then
    for vm in vgpud-demo-web vgpud-demo-ml; do virsh -c "$LV_URI" undefine "$vm" >/dev/null 2>&1 || true; done
  fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }
# refused CODE CMD...: run CMD, which must be refused with vgpuctl's exit
# CODE (docs/vgpuctl.md): the demo stops if it shows another refusal.
refused() {
  local want=$1 code=0
  shift
  printf '$ %s\n' "$*"
  "$@" || code=$?
  if [ "$code" != "$want" ]; then
    echo "demo: expected exit $want from '$*', got $code" >&2
    exit 1
  fi
}
# instance PROFILE uuid|device [N]: the UUID, or the device `vgpud sim` takes
# (VF address, mdev UUID, GPU/giN of a MIG instance), of the Nth (default
# first; -1 the last) instance of PROFILE, from vgpuctl's JSON.
instance() {
  vgpuctl list -o json | jq -er --arg p "$1" --arg what "$2" --argjson n "${3:-0}" '
    [.items[] | select(.profile == $p)][$n]
    | if $what == "uuid" then .uuid
      else .vgpu.vf // .vgpu.mdevUUID // "\(.gpu)/gi\(.mig.gpuInstanceID)" end'
}

# --- a private system bus with vgpud's shipped policy -----------------------
say "private D-Bus system bus"
# The same configuration as every private bus of the tests; root may watch
# it with busctl monitor.
sed -e "s|@SOCKET@|$work/bus.sock|" -e "s|@POLICY@|$root/systemd/dbus-1/dev.vgpud1.conf|" -e "s|@EXTRA@||" \
  "$root/internal/testenv/dbus/bus.conf.in" >"$work/bus.conf"
dbus-daemon --config-file="$work/bus.conf" --nofork --nopidfile 2>"$work/dbus.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$work/bus.sock" ] && break; sleep 0.05; done
export VGPUCTL_CONNECT="unix:path=$work/bus.sock"
echo "bus at $VGPUCTL_CONNECT"

# --- libvirtd, when installed ----------------------------------------------
# A privileged libvirtd keeps its state at fixed paths (/run/libvirt/*/driver.pid,
# /etc/libvirt/qemu, /var/lib/libvirt) whatever its configuration says, so a
# second one on a host whose own libvirtd runs exits at start-up. The demo's
# runs in a mount namespace of its own (held by a sleeping process made with
# unshare; the daemons join it with nsenter) where those paths are private
# directories under $work; its socket is in $work, reached from outside.
# lv_failed NAME LOG: libvirtd or virtlogd did not start: say so with its own
# last words, and stop.
lv_failed() {
  echo "$1 did not start; the last lines of its log ($2):" >&2
  tail -n 25 "$2" >&2 || true
  exit 1
}
LV_SOCKET=""
if command -v libvirtd >/dev/null && command -v virtlogd >/dev/null && command -v qemu-system-x86_64 >/dev/null &&
   command -v unshare >/dev/null && command -v nsenter >/dev/null && [ "$(id -u)" = 0 ]; then
  say "libvirtd with the QEMU driver (private: own mount namespace and socket)"
  getent group kvm >/dev/null || groupadd -r kvm
  lvroot=$work/libvirt
  mkdir -p "$lvroot/etc/libvirt"
  printf 'user = "root"\ngroup = "root"\n' >"$lvroot/etc/libvirt/qemu.conf"
  printf 'unix_sock_dir = "%s"\nunix_sock_rw_perms = "0700"\nauth_unix_rw = "none"\nauth_unix_ro = "none"\n' "$work" >"$work/libvirtd.conf"
  unshare --mount --propagation private -- sh -c 'set -e; root=$1; shift
    for p in "$@"; do mkdir -p "$root$p" "$p"; mount --bind "$root$p" "$p"; done
    echo ready; exec sleep infinity' holder "$lvroot" \
    /etc/libvirt /run/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt >"$work/ns.out" 2>"$work/ns.log" &
  ns=$!
  pids+=("$ns")
  for _ in $(seq 100); do grep -q ready "$work/ns.out" 2>/dev/null && break; sleep 0.05; done
  grep -q ready "$work/ns.out" || lv_failed "the private mount namespace (unshare)" "$work/ns.log"
  nsenter --target "$ns" --mount -- virtlogd -p /run/libvirt/virtlogd.pid >"$work/virtlogd.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [ -S "$lvroot/run/libvirt/virtlogd-sock" ] && break; sleep 0.05; done
  [ -S "$lvroot/run/libvirt/virtlogd-sock" ] || lv_failed virtlogd "$work/virtlogd.log"
  nsenter --target "$ns" --mount -- libvirtd -f "$work/libvirtd.conf" -p /run/libvirt/libvirtd.pid >"$work/libvirtd.log" 2>&1 &
  lv=$!
  pids+=("$lv")
  LV_SOCKET=$work/libvirt-sock
  LV_URI="qemu:///system?socket=$LV_SOCKET"
  for _ in $(seq 400); do
    virsh -c "$LV_URI" version >/dev/null 2>&1 && break
    kill -0 "$lv" 2>/dev/null || break
    sleep 0.05
  done
  virsh -c "$LV_URI" version >/dev/null 2>&1 || lv_failed libvirtd "$work/libvirtd.log"
  echo "libvirtd at $LV_SOCKET"
elif [ -S /run/libvirt/libvirt-sock ] && virsh -c qemu:///system version >/dev/null 2>&1; then
  say "the host's libvirtd"
  LV_SOCKET=/run/libvirt/libvirt-sock
  LV_URI=qemu:///system
else
  echo "(no libvirtd here, or not root: the demo skips the VMs)"
fi
if [ -n "$LV_SOCKET" ]; then
  LIBVIRT_OWNED=1
  for vm in vgpud-demo-web vgpud-demo-ml; do
    virsh -c "$LV_URI" undefine "$vm" >/dev/null 2>&1 || true   # left by an interrupted run
    cat > "$work/$vm.xml" <<EOF
<domain type='qemu'><name>$vm</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='pc'>hvm</type></os><devices/></domain>
EOF
    virsh -c "$LV_URI" define "$work/$vm.xml" >/dev/null
  done
  echo "two VMs defined: vgpud-demo-web, vgpud-demo-ml"
fi

# --- vgpud on the simulated host --------------------------------------------
say "vgpud --sim (2x H100: MIG and time-sliced, L4: vendor VFIO, A10: legacy mdev)"
args=(--sim --state-dir "$work/state" --bus-address "$VGPUCTL_CONNECT" --config /dev/null
      --metrics-listen 127.0.0.1:0 --log-level warn)
[ -n "$LV_SOCKET" ] && args+=(--libvirt-socket "$LV_SOCKET")
vgpud "${args[@]}" 2>"$work/vgpud.log" &
pids+=($!)
for _ in $(seq 400); do vgpuctl gpus >/dev/null 2>&1 && break; sleep 0.05; done
run vgpuctl version
run vgpuctl gpus

say "tenants with quotas"
run vgpuctl tenant define acme --vram 120GiB --compute 2500m --max-instances 8 --class guaranteed
run vgpuctl tenant define globex --vram 40GiB --compute 1 --class best-effort
run vgpuctl tenant list

say "carving: MIG instances, a MIG-backed vGPU, time-sliced vGPUs, an mdev"
run vgpuctl create 3g.40gb --tenant acme
run vgpuctl create H100XM-1-10C --tenant acme
run vgpuctl create 1g.10gb --tenant globex
run vgpuctl create 1g.10gb --tenant globex
run vgpuctl create H100XM-20C --tenant acme
run vgpuctl create L4-4Q --tenant globex
run vgpuctl create A10-4Q --tenant acme
run vgpuctl list

say "refusals are named, and change nothing"
# globex holds 24GiB of its 40GiB: a 20GiB vGPU fits the time-sliced H100
# but not the quota.
refused 6 vgpuctl create H100XM-20C --tenant globex   # QuotaExceeded
refused 2 vgpuctl create 9g.900gb --tenant acme       # InvalidArgument
refused 5 vgpuctl create 7g.80gb --tenant acme        # NoCapacity

say "capacity and planning"
run vgpuctl capacity
run vgpuctl plan 4g.40gb --tenant acme || true

if [ -n "$LV_SOCKET" ]; then
  say "attaching to VMs (persistent config; live when they run)"
  l4=$(instance L4-4Q uuid)
  a10=$(instance A10-4Q uuid)
  run vgpuctl attach vgpud-demo-web "$l4"
  run vgpuctl attach vgpud-demo-ml "$a10"
  run vgpuctl attach vgpud-demo-ml --profile H100XM-20C --tenant acme
  run vgpuctl dumpxml "$a10"
  echo "\$ virsh dumpxml --inactive vgpud-demo-ml | grep -A4 hostdev"
  virsh -c "$LV_URI" dumpxml --inactive vgpud-demo-ml | grep -A4 "<hostdev" | head -20
  run vgpuctl list
fi

say "the host as discovery sees it (NVML + sysfs), with each MIG GPU's slot map"
run vgpud inventory --sim --state-dir "$work/state"

say "a simulated workload: VMs using their vGPUs, a MIG job, a noisy neighbour on the time-sliced H100"
run vgpuctl create H100XM-20C --tenant acme
steady=$(instance H100XM-20C device -2)
noisy=$(instance H100XM-20C device -1)
l4dev=$(instance L4-4Q device)
a10dev=$(instance A10-4Q device)
migdev=$(instance 3g.40gb device)
if [ -n "$LV_SOCKET" ]; then
  run vgpuctl attach vgpud-demo-web "$(instance H100XM-20C uuid -1)"
fi
# vmof DEVICE: the UUID of the VM the device's instance is attached to (QEMU
# passes it as the VM id the driver reports, which is how vgpud tells whose
# run time is whose), or a new one when it is attached to none.
vmof() {
  vgpuctl list -o json | jq -r --arg d "$1" '
    [.items[] | select((.vgpu.vf // .vgpu.mdevUUID) == $d) | .attachment.vmUUID // empty][0] // empty' |
    grep . || cat /proc/sys/kernel/random/uuid
}
# A vGPU's workload runs while a VM has it open; a MIG instance's runs by itself.
n=0
for dev in "$steady" "$noisy" "$l4dev" "$a10dev"; do
  n=$((n + 1))
  run vgpud sim open-device "$dev" --vm-name "guest$n" --vm-uuid "$(vmof "$dev")" --state-dir "$work/state"
done
run vgpud sim workload "$steady" steady --demand 0.5 --state-dir "$work/state"
run vgpud sim workload "$noisy" noisy --state-dir "$work/state"
run vgpud sim workload "$l4dev" bursty --state-dir "$work/state"
run vgpud sim workload "$a10dev" steady --demand 0.3 --state-dir "$work/state"
run vgpud sim workload "$migdev" steady --demand 0.4 --state-dir "$work/state"

say "shares: entitled vs achieved compute, and interference"
run vgpuctl top -n 3 --interval 2s

say "a simulated host reboot: vgpud brings every instance back"
vgpud sim summary --state-dir "$work/state" | head -3
run vgpud sim reboot --state-dir "$work/state"
run vgpuctl reconcile
run vgpuctl list

if [ -n "${KEEP:-}" ]; then
  say "left running"
  echo "export VGPUCTL_CONNECT=$VGPUCTL_CONNECT"
  echo "watch the bus: busctl --address=$VGPUCTL_CONNECT monitor dev.vgpud1   (as root: dbus-daemon lets only root and its own user become monitors)"
  echo "state: $work"
fi
say "done"
