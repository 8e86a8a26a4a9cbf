#!/usr/bin/env bash
# Installs the system packages vgpud's build, demo and tests need on Debian 12.
# Idempotent: packages already present are skipped, users and groups created once.
set -euo pipefail

pkgs=(
  build-essential          # cgo (go-nvml)
  libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86
  libxml2-utils            # xmllint, used by virt-xml-validate
  dbus-daemon dbus-bin     # private bus for the D-Bus e2e tests
  prometheus               # prometheus + promtool for the metrics e2e tests
  util-linux               # setpriv
  systemd                  # systemd-analyze verify/security (no systemd as PID 1 needed)
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "$(id -u)" -ne 0 ]; then
  if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: missing ${missing[*]}; run as root to install them" >&2
    exit 1
  fi
  echo "install-deps: ok (not root: packages present, users not checked)"
  exit 0
fi
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
fi

# The QEMU driver of libvirtd wants these; the minimal packages do not create them.
getent group kvm >/dev/null || groupadd -r kvm
getent group libvirt-qemu >/dev/null || groupadd -r libvirt-qemu
getent passwd libvirt-qemu >/dev/null ||
  useradd -r -g libvirt-qemu -G kvm -d /var/lib/libvirt -s /usr/sbin/nologin libvirt-qemu
# Group whose members may use vgpud's D-Bus API (systemd/sysusers.d does this on real hosts).
getent group vgpud >/dev/null || groupadd -r vgpud

if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
  echo "install-deps: add /usr/local/go/bin to PATH" >&2
fi
echo "install-deps: ok"
