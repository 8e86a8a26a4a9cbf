#!/usr/bin/env bash
# Installs (or, with "uninstall", removes) vgpud in FHS locations:
#
#   scripts/install.sh install|uninstall|list
#
# Environment (the Makefile passes them): DESTDIR (staging root, default
# none), PREFIX (default /usr/local), and, to override single locations,
# BINDIR SBINDIR DATADIR MANDIR DOCDIR SYSCONFDIR UNITDIR TMPFILESDIR
# SYSUSERSDIR DBUSPOLICYDIR DBUSSERVICEDIR POLKITDIR COCKPITDIR. BUILDDIR
# holds the built binaries (default bin/).
#
# Locations follow what the consumers read, not only PREFIX: dbus-daemon
# reads policies from /usr/share/dbus-1/system.d and /etc/dbus-1/system.d
# only, and polkit reads actions from /usr/share/polkit-1/actions only, so
# a PREFIX other than /usr puts those two under /etc and /usr/share.
# Cockpit reads packages from $XDG_DATA_DIRS/cockpit (/usr/share and
# /usr/local/share by default), so the page goes to $DATADIR/cockpit/vgpud.
# /etc/vgpud/vgpud.yaml is installed only when absent and is left behind
# by uninstall when it was changed.
set -euo pipefail

mode=${1:-install}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

DESTDIR=${DESTDIR:-}
PREFIX=${PREFIX:-/usr/local}
PREFIX=${PREFIX%/}
BUILDDIR=${BUILDDIR:-bin}
BINDIR=${BINDIR:-$PREFIX/bin}
SBINDIR=${SBINDIR:-$PREFIX/sbin}
DATADIR=${DATADIR:-$PREFIX/share}
MANDIR=${MANDIR:-$DATADIR/man}
DOCDIR=${DOCDIR:-$DATADIR/doc/vgpud}
case "$PREFIX" in
/usr | /usr/local | "") SYSCONFDIR=${SYSCONFDIR:-/etc} ;;
*) SYSCONFDIR=${SYSCONFDIR:-$PREFIX/etc} ;;
esac
if [ "$PREFIX" = /usr ]; then
  libdir=/usr/lib
  DBUSPOLICYDIR=${DBUSPOLICYDIR:-/usr/share/dbus-1/system.d}
else
  libdir=$PREFIX/lib
  DBUSPOLICYDIR=${DBUSPOLICYDIR:-$SYSCONFDIR/dbus-1/system.d}
fi
UNITDIR=${UNITDIR:-$libdir/systemd/system}
TMPFILESDIR=${TMPFILESDIR:-$libdir/tmpfiles.d}
SYSUSERSDIR=${SYSUSERSDIR:-$libdir/sysusers.d}
DBUSSERVICEDIR=${DBUSSERVICEDIR:-$DATADIR/dbus-1/system-services}
POLKITDIR=${POLKITDIR:-/usr/share/polkit-1/actions}
POLKITRULESDIR=${POLKITRULESDIR:-/usr/share/polkit-1/rules.d}
VGPUDDATA=$DATADIR/vgpud
COCKPITDIR=${COCKPITDIR:-$DATADIR/cockpit/vgpud}

# plan lines: MODE SOURCE DEST [edit], where SOURCE "-" means generated
# into $gen, and edit means /usr/sbin and /usr/bin are rewritten to this
# install's SBINDIR and BINDIR.
gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
plan=()
add() { plan+=("$*"); }

binaries() {
  add 0755 "$BUILDDIR/vgpud" "$SBINDIR/vgpud"
  if [ -x "$BUILDDIR/vgpuctl" ]; then
    add 0755 "$BUILDDIR/vgpuctl" "$BINDIR/vgpuctl"
  elif [ "$mode" = install ]; then
    echo "install: $BUILDDIR/vgpuctl not built; skipping it" >&2
  fi
}

units() {
  add 0644 systemd/vgpud.service "$UNITDIR/vgpud.service" edit
  add 0644 systemd/vgpud.tmpfiles.conf "$TMPFILESDIR/vgpud.conf"
  add 0644 systemd/vgpud.sysusers.conf "$SYSUSERSDIR/vgpud.conf"
  local f
  # The D-Bus policy, activation file and polkit actions, wherever under
  # systemd/dbus-1 and systemd/polkit-1 they are kept.
  while IFS= read -r f; do
    case "$f" in
    *.conf) add 0644 "$f" "$DBUSPOLICYDIR/$(basename "$f")" ;;
    *.service) add 0644 "$f" "$DBUSSERVICEDIR/$(basename "$f")" edit ;;
    esac
  done < <(find systemd/dbus-1 -type f 2>/dev/null | sort)
  while IFS= read -r f; do
    case "$f" in
    *.policy) add 0644 "$f" "$POLKITDIR/$(basename "$f")" ;;
    *.rules) add 0644 "$f" "$POLKITRULESDIR/$(basename "$f")" ;;
    esac
  done < <(find systemd/polkit-1 -type f 2>/dev/null | sort)
  add 0644 systemd/vgpud.yaml "$SYSCONFDIR/vgpud/vgpud.yaml" config
}

data() {
  local f
  for f in profiles/*.yaml; do
    add 0644 "$f" "$VGPUDDATA/profiles/$(basename "$f")"
  done
  # Grafana dashboards (point a file provider at the directory) and the
  # Prometheus recording and alert rules; promtool test files stay behind.
  if [ -d dashboards ]; then
    while IFS= read -r f; do
      case "$f" in
      *_test.yml | *_test.yaml) ;;
      *.json) add 0644 "$f" "$VGPUDDATA/dashboards/$(basename "$f")" ;;
      *.yml | *.yaml) add 0644 "$f" "$VGPUDDATA/prometheus/$(basename "$f")" ;;
      esac
    done < <(find dashboards -maxdepth 1 -type f | sort)
  fi
  # The Cockpit page: plain files, no build step.
  if [ -d cockpit/vgpud ]; then
    while IFS= read -r f; do
      add 0644 "$f" "$COCKPITDIR/$(basename "$f")"
    done < <(find cockpit/vgpud -maxdepth 1 -type f | sort)
  fi
  [ -f docs/operations.md ] && add 0644 docs/operations.md "$DOCDIR/operations.md"
  add 0644 systemd/vgpud.yaml "$DOCDIR/vgpud.yaml.example"
  # A polkit rule an operator copies to /etc/polkit-1/rules.d (operations.md).
  add 0644 systemd/vgpud-operators.rules.example "$DOCDIR/vgpud-operators.rules.example"
}

# vgpuctl's man pages and completions come from scripts/gen-man.sh (run
# on the built binary); vgpud's completions from its cobra generator.
generated() {
  local f prog bin sec
  local have_ctl=
  if [ -x scripts/gen-man.sh ] && [ -x "$BUILDDIR/vgpuctl" ] && [ "$mode" != list ]; then
    if VGPUCTL=$BUILDDIR/vgpuctl scripts/gen-man.sh "$gen/doc" >/dev/null; then
      while IFS= read -r f; do
        sec=${f##*.}
        add 0644 "$f" "$MANDIR/man$sec/$(basename "$f")"
      done < <(find "$gen/doc/man" -type f -name '*.[1-8]' | sort)
      [ -f "$gen/doc/completions/vgpuctl.bash" ] && add 0644 "$gen/doc/completions/vgpuctl.bash" "$DATADIR/bash-completion/completions/vgpuctl"
      [ -f "$gen/doc/completions/_vgpuctl" ] && add 0644 "$gen/doc/completions/_vgpuctl" "$DATADIR/zsh/vendor-completions/_vgpuctl"
      [ -f "$gen/doc/completions/vgpuctl.fish" ] && add 0644 "$gen/doc/completions/vgpuctl.fish" "$DATADIR/fish/vendor_completions.d/vgpuctl.fish"
      have_ctl=1
    else
      echo "install: scripts/gen-man.sh failed; no vgpuctl man pages" >&2
    fi
  elif [ "$mode" = install ]; then
    echo "install: scripts/gen-man.sh or $BUILDDIR/vgpuctl missing; no man pages" >&2
  fi
  for prog in vgpud vgpuctl; do
    bin=$BUILDDIR/$prog
    [ -x "$bin" ] || continue
    [ "$prog" = vgpuctl ] && [ -n "$have_ctl" ] && continue
    "$bin" completion bash >"$gen/$prog.bash" 2>/dev/null || continue
    "$bin" completion zsh >"$gen/_$prog" 2>/dev/null || continue
    "$bin" completion fish >"$gen/$prog.fish" 2>/dev/null || continue
    add 0644 "$gen/$prog.bash" "$DATADIR/bash-completion/completions/$prog"
    add 0644 "$gen/_$prog" "$DATADIR/zsh/vendor-completions/_$prog"
    add 0644 "$gen/$prog.fish" "$DATADIR/fish/vendor_completions.d/$prog.fish"
  done
}

binaries
units
data
generated

# edit rewrites the FHS /usr paths a shipped file names to this install's.
edit() {
  sed -e "s#/usr/sbin/vgpud#$SBINDIR/vgpud#g" -e "s#/usr/bin/vgpuctl#$BINDIR/vgpuctl#g" \
    -e "s#/usr/share/doc/vgpud#$DOCDIR#g" "$1"
}

do_install() {
  local line m src dst how
  for line in "${plan[@]}"; do
    read -r m src dst how <<<"$line"
    [ -e "$src" ] || { echo "install: $src missing (run make build)" >&2; exit 1; }
    case "$how" in
    edit)
      install -d -m 0755 "$DESTDIR$(dirname "$dst")"
      edit "$src" >"$gen/edited"
      install -m "$m" "$gen/edited" "$DESTDIR$dst"
      ;;
    config)
      if [ -e "$DESTDIR$dst" ]; then
        echo "install: keeping $DESTDIR$dst" >&2
        continue
      fi
      install -D -m "$m" "$src" "$DESTDIR$dst"
      ;;
    *) install -D -m "$m" "$src" "$DESTDIR$dst" ;;
    esac
    echo "$dst"
  done
  install -d -m 0755 "$DESTDIR$SYSCONFDIR/vgpud/profiles.d"
  echo "$SYSCONFDIR/vgpud/profiles.d/"
}

do_uninstall() {
  local line m src dst how
  for line in "${plan[@]}"; do
    read -r m src dst how <<<"$line"
    if [ "$how" = config ] && [ -e "$DESTDIR$dst" ] && ! cmp -s "$src" "$DESTDIR$dst"; then
      echo "uninstall: $DESTDIR$dst was changed; leaving it" >&2
      continue
    fi
    rm -f "$DESTDIR$dst"
  done
  # Man pages of an older build may differ from this one's; remove ours
  # by name.
  rm -f "$DESTDIR$MANDIR"/man[1-8]/vgpud.[1-8]* "$DESTDIR$MANDIR"/man[1-8]/vgpuctl.[1-8]* \
    "$DESTDIR$MANDIR"/man[1-8]/vgpuctl-*.[1-8]* "$DESTDIR$MANDIR"/man[1-8]/vgpud-*.[1-8]*
  local d
  for d in "$VGPUDDATA/profiles" "$VGPUDDATA/dashboards" "$VGPUDDATA/prometheus" "$VGPUDDATA" "$DOCDIR" "$COCKPITDIR" \
    "$SYSCONFDIR/vgpud/profiles.d" "$SYSCONFDIR/vgpud"; do
    # Only vgpud's own directories, and only when empty.
    [ -d "$DESTDIR$d" ] && rmdir "$DESTDIR$d" 2>/dev/null || true
  done
  echo "uninstall: removed vgpud from ${DESTDIR:-/}" >&2
}

case "$mode" in
install) do_install ;;
uninstall) do_uninstall ;;
list)
  for line in "${plan[@]}"; do
    read -r _ _ dst _ <<<"$line"
    echo "$dst"
  done
  ;;
*)
  echo "usage: $0 install|uninstall|list" >&2
  exit 2
  ;;
esac
