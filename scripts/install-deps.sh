#!/usr/bin/env bash
# Installs what vgpud's build, demo and tests need on Debian 12: the system
# packages, and Go 1.26 into /usr/local/go when no Go 1.26 or newer is found
# there or on PATH (Debian 12's golang is too old).
# Idempotent: packages already present are skipped, users and groups created
# once, Go installed once.
#
# Go comes from the Go module proxy (the first URL in $GOPROXY, else
# https://proxy.golang.org) as the golang.org/toolchain module, the same zip
# the go command's own toolchain switching downloads, checked against a
# pinned SHA-256. VGPUD_GO_ROOT installs it elsewhere than /usr/local/go.
set -euo pipefail

go_version=1.26.8
go_root=${VGPUD_GO_ROOT:-/usr/local/go}
# sha256sum of golang.org/toolchain@v0.0.1-go$go_version.linux-$arch.zip as
# the proxy serves it; when these were pinned, go mod download had checked
# the module against sum.golang.org.
declare -A go_sha256=(
  [amd64]=30c2b1bf7dcc88d3eb0a1364e47ddd9128edb3110a30e8a0ef61cd5856b31de7
  [arm64]=02b36b6787b3ac767668f630e2998df45a3b1f9ffee08d1bf3ef6487cd658d99
)

pkgs=(
  build-essential          # cgo (go-nvml)
  curl ca-certificates unzip  # fetching Go from the module proxy
  jq                       # the demo reads vgpuctl's JSON
  libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86
  libxml2-utils            # xmllint, used by virt-xml-validate
  dbus-daemon dbus-bin     # private bus for the D-Bus e2e tests
  prometheus               # prometheus + promtool for the metrics e2e tests
  util-linux               # setpriv
  systemd                  # systemd-analyze verify/security (no systemd as PID 1 needed)
  debootstrap systemd-container  # the container tier: a Debian root booted by systemd-nspawn
  placement-api python3-placement uwsgi uwsgi-plugin-python3  # OpenStack Placement for the fleet tests
  postgresql               # Placement on PostgreSQL as production runs it (bench-fleet-scale, TestPostgresPlacement): a private cluster per run
  python3-nova             # Nova's own scheduler code (report client, request parser) as the fleet tests' scheduler
  chromium cockpit-ws cockpit-bridge cockpit-system  # the Cockpit page's browser tests (cockpit-bridge carries base1/cockpit.js, cockpit-system the shell)
  eslint                   # make lint: the Cockpit page's JavaScript
)

# go_ok GO: GO runs and is Go 1.26 or newer.
go_ok() {
  local v major rest minor
  v=$(GOTOOLCHAIN=local "$1" env GOVERSION 2>/dev/null) || return 1
  v=${v#go}
  major=${v%%.*}
  rest=${v#*.}
  minor=${rest%%[!0-9]*}
  [ -n "$major" ] && [ -n "$minor" ] || return 1
  [ "$major" -gt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -ge 26 ]; }
}

# find_go prints the go the build will use, if it is Go 1.26 or newer. The
# Makefile puts $go_root/bin first on PATH, so a Go there decides.
find_go() {
  if [ -x "$go_root/bin/go" ]; then
    go_ok "$go_root/bin/go" && echo "$go_root/bin/go"
    return 0
  fi
  if command -v go >/dev/null && go_ok "$(command -v go)"; then
    command -v go
  fi
  return 0
}

# install_go downloads Go from the module proxy into $go_root.
install_go() {
  local arch proxy e entries url parent tmp src old
  case $(uname -m) in
    x86_64) arch=amd64 ;;
    aarch64) arch=arm64 ;;
    *)
      echo "install-deps: no pinned Go $go_version for $(uname -m); install Go 1.26 or newer by hand" >&2
      exit 1
      ;;
  esac
  proxy=https://proxy.golang.org
  IFS=',|' read -ra entries <<<"${GOPROXY:-}"
  for e in "${entries[@]}"; do
    case $e in http://* | https://*)
      proxy=${e%/}
      break
      ;;
    esac
  done
  url=$proxy/golang.org/toolchain/@v/v0.0.1-go$go_version.linux-$arch.zip
  echo "install-deps: installing Go $go_version into $go_root from $url"
  parent=$(dirname "$go_root")
  mkdir -p "$parent"
  # Unpacked beside go_root, so the final rename stays on one file system.
  tmp=$(mktemp -d "$parent/.go-install.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  curl -fsSL --retry 3 -o "$tmp/go.zip" "$url"
  if ! echo "${go_sha256[$arch]}  $tmp/go.zip" | sha256sum -c --quiet -; then
    echo "install-deps: $url does not have the pinned SHA-256; not installing it" >&2
    exit 1
  fi
  unzip -q "$tmp/go.zip" -d "$tmp"
  # The module's files sit under golang.org/toolchain@VERSION/: a GOROOT.
  src=$tmp/golang.org/toolchain@v0.0.1-go$go_version.linux-$arch
  chmod -R a+rX "$src"
  if [ -e "$go_root" ]; then
    # An older Go: kept aside, not deleted.
    old=$go_root.old-$(date +%Y%m%d%H%M%S)
    echo "install-deps: moving the older Go at $go_root to $old"
    mv "$go_root" "$old"
  fi
  mv "$src" "$go_root"
  rm -rf "$tmp"
  trap - EXIT
  if ! go_ok "$go_root/bin/go"; then
    echo "install-deps: $go_root/bin/go does not run as Go 1.26 or newer" >&2
    exit 1
  fi
  echo "install-deps: $("$go_root/bin/go" version)"
}

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
go_bin=$(find_go)
if [ "$(id -u)" -ne 0 ]; then
  if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: missing ${missing[*]}; run as root to install them" >&2
    exit 1
  fi
  if [ -z "$go_bin" ]; then
    echo "install-deps: no Go 1.26 or newer at $go_root or on PATH; run as root to install it" >&2
    exit 1
  fi
  echo "install-deps: ok (not root: packages and Go present, users not checked)"
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

if [ -n "$go_bin" ]; then
  echo "install-deps: $(GOTOOLCHAIN=local "$go_bin" env GOVERSION) at $go_bin"
else
  install_go
  go_bin=$go_root/bin/go
fi
if [ "$go_bin" = "$go_root/bin/go" ] && [[ ":$PATH:" != *":$go_root/bin:"* ]]; then
  echo "install-deps: add $go_root/bin to PATH (the Makefile does)" >&2
fi
echo "install-deps: ok"
