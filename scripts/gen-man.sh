#!/bin/sh
# Write vgpuctl's man pages (DIR/man/vgpuctl*.1), vgpud's (DIR/man/vgpud*.8,
# when a vgpud binary sits beside vgpuctl or $VGPUD names one) and vgpuctl's bash, zsh and fish
# completion scripts (DIR/completions/) from the command definitions, so
# they never drift from the binary. `make man` calls it.
#
#   scripts/gen-man.sh DIR            build vgpuctl and generate
#   VGPUCTL=bin/vgpuctl scripts/gen-man.sh DIR   use a built binary
#
# SOURCE_DATE_EPOCH, when set, dates the man pages (reproducible builds).
set -eu
out=${1:?usage: scripts/gen-man.sh DIR}
cd "$(dirname "$0")/.."
case $out in /*) ;; *) out=$(pwd)/$out ;; esac
PATH=$PATH:/usr/local/go/bin
bin=${VGPUCTL:-}
if [ -z "$bin" ]; then
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	CGO_ENABLED=0 go build -o "$tmp/vgpuctl" ./cmd/vgpuctl
	bin=$tmp/vgpuctl
fi
rm -rf "$out/man" "$out/completions"
"$bin" gen-docs --man "$out/man" --completions "$out/completions"
# vgpud's own pages (section 8), from a vgpud built beside vgpuctl.
vgpud=${VGPUD:-$(dirname "$bin")/vgpud}
if [ -x "$vgpud" ]; then
	"$vgpud" gen-docs --man "$out/man"
fi
echo "man pages in $out/man, completions in $out/completions"
