#!/usr/bin/env bash
# Builds a Debian package of vgpud from the built binaries (make build):
#
#   scripts/package-deb.sh [OUTDIR]      writes OUTDIR (default bin/)/vgpud_<version>_<arch>.deb
#
# The tree is what `make install PREFIX=/usr` installs. The maintainer
# scripts create group vgpud and the directories (sysusers.d, tmpfiles.d),
# reload systemd and the bus and enable the unit on install (which also
# enables its D-Bus activation: Alias=dbus-dev.vgpud1.service); they stop
# and disable it on removal, and a purge removes the state directory
# /var/lib/vgpud, which a plain removal keeps. /etc/vgpud/vgpud.yaml is a
# conffile. VERSION overrides the version (default: git describe, made a
# valid Debian version); BUILDDIR the directory of the built binaries
# (default bin/); DEB_COMPRESS dpkg-deb's compressor (default xz, the
# smallest; gzip builds in seconds where xz takes a minute on two cores,
# which the container tests use).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
out=${1:-bin}
mkdir -p "$out"
out=$(cd "$out" && pwd)
command -v dpkg-deb >/dev/null || { echo "package-deb: dpkg-deb not found" >&2; exit 1; }
BUILDDIR=${BUILDDIR:-bin}
[ -x "$BUILDDIR/vgpud" ] || { echo "package-deb: $BUILDDIR/vgpud missing (run make build)" >&2; exit 1; }
export BUILDDIR

# A Debian version starts with a digit and has no '-' outside the
# revision; without a tag, 0~git<commit> sorts below any release.
if [ -z "${VERSION:-}" ]; then
  if VERSION=$(git describe --tags --dirty 2>/dev/null); then
    VERSION=${VERSION#v}
  else
    VERSION=0~git$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  fi
fi
version=$(echo "$VERSION" | tr '-' '~')
arch=$(dpkg --print-architecture)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
DESTDIR=$stage PREFIX=/usr scripts/install.sh install >/dev/null
mkdir -p "$stage/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
# procps: /bin/kill, which the unit's ExecReload= runs (debootstrap's
# minimal Debian does not have it).
cat >"$stage/DEBIAN/control" <<CONTROL
Package: vgpud
Version: $version
Architecture: $arch
Maintainer: vgpud maintainers <vgpud@localhost>
Installed-Size: $size
Depends: libc6, systemd, dbus, procps
Recommends: libvirt-daemon-system
Suggests: cockpit-ws, cockpit-bridge
Section: admin
Priority: optional
Description: carves NVIDIA GPUs into MIG instances and vGPUs for libvirt VMs
 vgpud is a host daemon for GPU hypervisors: it creates MIG instances and
 vGPUs on NVIDIA GPUs, attaches them to libvirt VMs, holds tenants to their
 VRAM and compute quotas, and exports how well tenants are isolated. vgpuctl
 is its command-line client; orchestrators use its D-Bus API (dev.vgpud1).
 A Cockpit page (/usr/share/cockpit/vgpud) shows and changes the same in
 the web console.
CONTROL
echo /etc/vgpud/vgpud.yaml >"$stage/DEBIAN/conffiles"
cat >"$stage/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
	systemd-sysusers vgpud.conf || true
	systemd-tmpfiles --create vgpud.conf || true
	if [ -d /run/systemd/system ]; then
		systemctl daemon-reload || true
		systemctl enable vgpud.service || true
		systemctl reload dbus.service 2>/dev/null || true
	fi
fi
POSTINST
cat >"$stage/DEBIAN/prerm" <<'PRERM'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
	systemctl disable --now vgpud.service || true
fi
PRERM
cat >"$stage/DEBIAN/postrm" <<'POSTRM'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
	systemctl reload dbus.service 2>/dev/null || true
fi
# The records of every instance and tenant: kept on removal (a reinstall
# reconciles them), removed only on purge.
if [ "$1" = purge ]; then
	rm -rf /var/lib/vgpud
	# The metrics socket's directory (tmpfiles.d); empty once vgpud stopped.
	rmdir /run/vgpud 2>/dev/null || true
fi
POSTRM
chmod 0755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/prerm" "$stage/DEBIAN/postrm"
deb=$out/vgpud_${version}_${arch}.deb
dpkg-deb -Z"${DEB_COMPRESS:-xz}" --root-owner-group --build "$stage" "$deb" >/dev/null
echo "$deb"
