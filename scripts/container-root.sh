#!/usr/bin/env bash
# Builds (once) the Debian 12 root the container tests boot with
# systemd-nspawn, and prints its path:
#
#   scripts/container-root.sh            prints CACHE/bookworm-<key>
#
# The root is debootstrap's minbase plus what an operator's host has for
# vgpud: systemd as PID 1, the system bus, logind (polkitd needs it) and
# polkitd, procps (/bin/kill, the unit's ExecReload=), and cockpit-ws and
# cockpit-bridge (the web console's login test). It is cached
# under VGPUD_CONTAINER_CACHE (default /var/cache/vgpud-e2e), keyed by the
# suite, the mirror and the package list, so it is built once per machine
# (about 80 s) and reused by every later run; tests boot it through an
# overlay and never change it. A half-built root is never used: it is built
# beside the cache and renamed into place.
set -euo pipefail
suite=bookworm
mirror=${VGPUD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
pkgs=systemd,systemd-sysv,dbus,libpam-systemd,polkitd,procps
# Cockpit's web service and bridge, for the web console's login test. They
# are installed by apt in the built root, not by debootstrap: debootstrap's
# one-pass configuration of their dependencies (dconf) fails.
extra="cockpit-ws cockpit-bridge"
cache=${VGPUD_CONTAINER_CACHE:-/var/cache/vgpud-e2e}

[ "$(id -u)" -eq 0 ] || { echo "container-root: needs root (debootstrap)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "container-root: debootstrap not found (scripts/install-deps.sh installs it)" >&2; exit 1; }

key=$(printf '%s\n' "$suite" "$mirror" "$pkgs" "$extra" | sha256sum | cut -c1-12)
root=$cache/$suite-$key
mkdir -p "$cache"
# One builder at a time; the others wait and then find the root built.
exec 9>"$cache/.lock"
flock 9
if [ -x "$root/usr/lib/systemd/systemd" ]; then
  echo "$root"
  exit 0
fi
tmp=$(mktemp -d "$cache/.build-$suite.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log=$tmp.log
if ! timeout 900 debootstrap --variant=minbase --include="$pkgs" "$suite" "$tmp/root" "$mirror" >"$log" 2>&1; then
  echo "container-root: debootstrap $suite failed; its last lines ($log):" >&2
  tail -n 20 "$log" >&2
  exit 1
fi
if ! timeout 900 systemd-nspawn --quiet --register=no --keep-unit --resolv-conf=copy-host -D "$tmp/root" \
    /bin/sh -c "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $extra" >>"$log" 2>&1; then
  echo "container-root: apt-get install $extra failed; its last lines ($log):" >&2
  tail -n 20 "$log" >&2
  exit 1
fi
rm -f "$log"
# apt's downloads are not needed to boot.
rm -rf "$tmp/root/var/cache/apt/archives/"*.deb "$tmp/root/var/lib/apt/lists/"*_Packages
mv "$tmp/root" "$root"
echo "$root"
