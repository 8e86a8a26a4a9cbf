#!/usr/bin/env bash
# The fleet demo: vgpud publishes the built-in simulated host to a real
# OpenStack Placement (sqlite, noauth2, served by uwsgi on 127.0.0.1), and
# a fleet scheduler's view of it is shown: vgpuctl fleet status, and an
# allocation-candidates query for a MIG profile. Everything lives in a
# temporary directory and is stopped at the end.
#
#   make demo-fleet      (builds, then runs this)
#   KEEP=1 make demo-fleet   leaves Placement and vgpud running
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export PATH=/usr/local/go/bin:$root/bin:$PATH

for need in /usr/bin/placement-api /usr/bin/placement-manage; do
  [ -e "$need" ] || { echo "demo-fleet: $need is missing: apt-get install placement-api python3-placement (scripts/install-deps.sh)" >&2; exit 1; }
done
for cmd in uwsgi dbus-daemon curl jq; do
  command -v "$cmd" >/dev/null || { echo "demo-fleet: $cmd is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/vgpud-demo-fleet.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
  [ -n "${KEEP:-}" ] && return
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

# --- Placement ----------------------------------------------------------------
say "OpenStack Placement (sqlite, noauth2) under uwsgi"
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
P="http://127.0.0.1:$port"
printf '[DEFAULT]\ndebug = false\n[api]\nauth_strategy = noauth2\n[placement_database]\nconnection = sqlite:///%s/placement.db\n' "$work" >"$work/placement.conf"
timeout 120 /usr/bin/python3 /usr/bin/placement-manage --config-file "$work/placement.conf" db sync >"$work/db-sync.log" 2>&1
uwsgi --plugin python3 --http-socket "127.0.0.1:$port" --wsgi-file /usr/bin/placement-api --master --processes 1 --threads 4 \
  --lazy-apps --die-on-term --env "OS_PLACEMENT_CONFIG_DIR=$work" >"$work/uwsgi.log" 2>&1 &
pids+=($!)
for _ in $(seq 600); do curl -sf -m 2 "$P/" >/dev/null && break; sleep 0.1; done
curl -sf -m 5 "$P/" | jq -c '.versions[0] | {id, min_version, max_version}'

# --- a private system bus and vgpud with fleet: ------------------------------
sed -e "s|@SOCKET@|$work/bus.sock|" -e "s|@POLICY@|$root/systemd/dbus-1/dev.vgpud1.conf|" -e "s|@EXTRA@||" \
  "$root/internal/testenv/dbus/bus.conf.in" >"$work/bus.conf"
dbus-daemon --config-file="$work/bus.conf" --nofork --nopidfile 2>"$work/dbus.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$work/bus.sock" ] && break; sleep 0.05; done
export VGPUCTL_CONNECT="unix:path=$work/bus.sock"

say "vgpud --sim with a fleet: section"
cat >"$work/vgpud.yaml" <<YAML
version: v1
fleet:
  endpoint: $P
  host: demo-host
  syncInterval: 30s
YAML
run cat "$work/vgpud.yaml"
vgpud --sim --state-dir "$work/state" --bus-address "$VGPUCTL_CONNECT" --config "$work/vgpud.yaml" \
  --metrics-listen "" --libvirt-socket "" --log-level warn 2>"$work/vgpud.log" &
pids+=($!)
for _ in $(seq 400); do vgpuctl gpus >/dev/null 2>&1 && break; sleep 0.05; done
run vgpuctl tenant define acme --vram 200GiB --compute 4 --max-instances 8

say "local creates claim in Placement first, then carve"
run vgpuctl create 3g.40gb --tenant acme
run vgpuctl create L4-4Q --tenant acme
# The sync is event-driven: wait for the pass that follows the creates.
for _ in $(seq 100); do
  [ "$(vgpuctl fleet status -o json | jq '.fleet.differences | length')" = 0 ] && break
  sleep 0.1
done
run vgpuctl fleet status

say "a fleet scheduler asks Placement where a 3g.40gb fits"
q="resources=CUSTOM_VGPUD_MIG_3G_40GB:1,CUSTOM_VGPUD_MIG_SLICE:4"
echo "\$ curl -H 'X-Auth-Token: admin' -H 'OpenStack-API-Version: placement 1.39' '$P/allocation_candidates?$q'"
curl -sf -m 10 -H 'X-Auth-Token: admin' -H 'OpenStack-API-Version: placement 1.39' "$P/allocation_candidates?$q" |
  jq -r '.provider_summaries as $s | .allocation_requests[] | .allocations | to_entries[]
    | "candidate provider \(.key): \(.value.resources | to_entries | map("\(.key)=\(.value)") | join(", ")) (slices free: \($s[.key].resources.CUSTOM_VGPUD_MIG_SLICE | .capacity - .used))"'

say "the scheduler claims it, then asks this host to carve what it claimed"
consumer=$(/usr/bin/python3 -c 'import uuid; print(uuid.uuid4())')
req=$(curl -sf -m 10 -H 'X-Auth-Token: admin' -H 'OpenStack-API-Version: placement 1.39' "$P/allocation_candidates?$q&limit=1" |
  jq '{allocations: .allocation_requests[0].allocations, project_id: "fleet", user_id: "scheduler", consumer_generation: null, consumer_type: "INSTANCE"}')
curl -sf -m 10 -X PUT -H 'X-Auth-Token: admin' -H 'OpenStack-API-Version: placement 1.39' -H 'Content-Type: application/json' \
  -d "$req" "$P/allocations/$consumer"
echo "claimed 3g.40gb in Placement for consumer $consumer; until the create comes, fleet status names it:"
printf '$ vgpuctl fleet status -o json | jq .fleet.differences\n'
vgpuctl fleet status -o json | jq -c '.fleet.differences[]'
run vgpuctl create 3g.40gb --tenant acme --placement-consumer "$consumer"
for _ in $(seq 100); do
  [ "$(vgpuctl fleet status -o json | jq '.fleet.differences | length')" = 0 ] && break
  sleep 0.1
done
printf '$ vgpuctl fleet status -o json | jq .fleet.differences\n'
vgpuctl fleet status -o json | jq -c '.fleet.differences'
echo "and the GPU's slices are now all held in Placement:"
echo "\$ curl -H 'X-Auth-Token: admin' -H 'OpenStack-API-Version: placement 1.39' '$P/allocation_candidates?$q'"
curl -sf -m 10 -H 'X-Auth-Token: admin' -H 'OpenStack-API-Version: placement 1.39' "$P/allocation_candidates?$q"
echo

if [ -n "${KEEP:-}" ]; then
  say "left running"
  echo "Placement: $P (X-Auth-Token: admin)   export VGPUCTL_CONNECT=$VGPUCTL_CONNECT   files: $work"
fi
