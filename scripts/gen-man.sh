#!/bin/sh
# Write vgpuctl's man pages (DIR/man/vgpuctl*.1), vgpud's (DIR/man/vgpud*.8,
# which vgpud.service names) and vgpuctl's bash, zsh and fish completion
# scripts (DIR/completions/) from the command definitions, so they never
# drift from the binaries. `make man` calls it.
#
#   scripts/gen-man.sh DIR            build vgpuctl and vgpud and generate
#   VGPUCTL=bin/vgpuctl scripts/gen-man.sh DIR   use built binaries: vgpud
#                                     beside vgpuctl, or $VGPUD; built when
#                                     neither is there
#
# SOURCE_DATE_EPOCH, when set, dates the man pages (reproducible builds).
set -eu
out=${1:?usage: scripts/gen-man.sh DIR}
cd "$(dirname "$0")/.."
case $out in /*) ;; *) out=$(pwd)/$out ;; esac
PATH=$PATH:/usr/local/go/bin
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=${VGPUCTL:-}
if [ -z "$bin" ]; then
	CGO_ENABLED=0 go build -o "$tmp/vgpuctl" ./cmd/vgpuctl
	bin=$tmp/vgpuctl
fi
# vgpud's own pages (section 8): from $VGPUD, a vgpud beside vgpuctl, or one
# built here.
vgpud=${VGPUD:-$(dirname "$bin")/vgpud}
if [ ! -x "$vgpud" ]; then
	go build -o "$tmp/vgpud" ./cmd/vgpud
	vgpud=$tmp/vgpud
fi
rm -rf "$out/man" "$out/completions"
"$bin" gen-docs --man "$out/man" --completions "$out/completions"
"$vgpud" gen-docs --man "$out/man"
echo "man pages in $out/man, completions in $out/completions"
