#!/usr/bin/env bash
# Checks the systemd integration as installed (CI runs it as `make verify-units`):
#
#   1. installs into a temporary DESTDIR with PREFIX=/usr, the layout
#      distribution packages use;
#   2. systemd-analyze verify on the installed unit. Outside a --root,
#      verify resolves ExecStart= on this machine, so a copy whose
#      /usr/sbin/vgpud points into DESTDIR is verified: the installed binary
#      must exist and be executable;
#   3. systemd-analyze security --offline=true: prints the table and the
#      overall exposure, and fails above MAX_EXPOSURE (default 2.5);
#   4. systemd-sysusers and systemd-tmpfiles run against DESTDIR (--root),
#      which parses the sysusers.d/tmpfiles.d files and creates group vgpud
#      and the directories there;
#   5. the D-Bus policy and polkit actions are well-formed XML, and the
#      D-Bus activation file names the unit.
#
# Needs systemd-analyze (systemd 252 works without systemd as PID 1).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
MAX_EXPOSURE=${MAX_EXPOSURE:-2.5}
command -v systemd-analyze >/dev/null || { echo "verify-units: systemd-analyze not found (apt-get install systemd)" >&2; exit 1; }

dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
DESTDIR=$dest PREFIX=/usr scripts/install.sh install >/dev/null
unit=$dest/usr/lib/systemd/system/vgpud.service
[ -f "$unit" ] || { echo "verify-units: $unit not installed" >&2; exit 1; }
[ -x "$dest/usr/sbin/vgpud" ] || { echo "verify-units: vgpud binary not installed" >&2; exit 1; }

echo "== installed tree (DESTDIR, PREFIX=/usr)"
(cd "$dest" && find . \( -type f -o -type l \) | sed 's#^\.##' | sort)

echo "== systemd-analyze verify (ExecStart=$dest/usr/sbin/vgpud)"
check=$(mktemp -d)
trap 'rm -rf "$dest" "$check"' EXIT
sed "s#/usr/sbin/vgpud#$dest/usr/sbin/vgpud#g" "$unit" >"$check/vgpud.service"
man=(--man=no)
if ls "$dest/usr/share/man/man1/vgpuctl.1"* >/dev/null 2>&1 && command -v man >/dev/null; then
  # Documentation=man:vgpuctl(1) must resolve to the installed page.
  export MANPATH=$dest/usr/share/man
  man=()
else
  echo "(vgpuctl(1) not installed or man missing: the Documentation= man page is not checked)"
fi
systemd-analyze verify "${man[@]}" "$check/vgpud.service"
echo "ok"

echo "== systemd-analyze security --offline=true"
out=$(systemd-analyze security --offline=true --no-pager "$unit" 2>&1) || true
echo "$out"
score=$(echo "$out" | sed -n 's/.*Overall exposure level for vgpud.service: \([0-9.]*\).*/\1/p')
[ -n "$score" ] || { echo "verify-units: no exposure score in the output" >&2; exit 1; }
echo "exposure score: $score (maximum $MAX_EXPOSURE)"
if awk -v s="$score" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(s > m) }'; then
  echo "verify-units: exposure $score is above $MAX_EXPOSURE" >&2
  exit 1
fi

echo "== sysusers.d and tmpfiles.d (applied to an empty root)"
sys=$check/root
mkdir -p "$sys/etc"
touch "$sys/etc/passwd" "$sys/etc/group"
systemd-sysusers --root="$sys" "$dest/usr/lib/sysusers.d/vgpud.conf"
grep -q '^vgpud:' "$sys/etc/group" || { echo "verify-units: sysusers.d did not create group vgpud" >&2; exit 1; }
systemd-tmpfiles --root="$sys" --create "$dest/usr/lib/tmpfiles.d/vgpud.conf"
for d in var/lib/vgpud etc/vgpud/profiles.d run/vgpud; do
  [ -d "$sys/$d" ] || { echo "verify-units: tmpfiles.d did not create /$d" >&2; exit 1; }
done
# The metrics socket's directory: group vgpud, set-group-ID, so the
# socket made there is the group's without a chown (the unit allows none).
run_mode=$(stat -c '%a %g' "$sys/run/vgpud")
want_run="2750 $(grep '^vgpud:' "$sys/etc/group" | cut -d: -f3)"
[ "$run_mode" = "$want_run" ] || { echo "verify-units: /run/vgpud is $run_mode (mode gid), want $want_run" >&2; exit 1; }
echo "ok: group $(grep '^vgpud:' "$sys/etc/group"), /var/lib/vgpud mode $(stat -c %a "$sys/var/lib/vgpud"), /run/vgpud $run_mode"

echo "== D-Bus and polkit files"
xml=$(find "$dest/usr/share/dbus-1/system.d" "$dest/usr/share/polkit-1" -type f \( -name '*.conf' -o -name '*.policy' \) 2>/dev/null | sort)
if [ -z "$xml" ]; then
  echo "verify-units: no D-Bus policy or polkit actions installed" >&2
  exit 1
fi
if command -v xmllint >/dev/null; then
  # shellcheck disable=SC2086
  xmllint --noout --nonet $xml
  echo "well-formed: $(echo $xml | sed "s#$dest##g")"
else
  echo "(xmllint not found: XML not checked)"
fi
for f in "$dest"/usr/share/dbus-1/system-services/*.service; do
  [ -e "$f" ] || continue
  # The activation names the unit's alias, which exists only while the
  # unit is enabled.
  grep -q '^SystemdService=dbus-dev.vgpud1.service$' "$f" || { echo "verify-units: $f does not activate dbus-dev.vgpud1.service" >&2; exit 1; }
  grep -q '^Alias=dbus-dev.vgpud1.service$' "$unit" || { echo "verify-units: vgpud.service has no Alias=dbus-dev.vgpud1.service for D-Bus activation" >&2; exit 1; }
done
echo "verify-units: ok"
