#!/usr/bin/env bash
# Runs every Go fuzz target of the project for a while each (default 20s).
# The seed corpora alone run with `make test`; this explores beyond them.
set -euo pipefail
cd "$(dirname "$0")/.."
time=${1:-20s}
export PATH=/usr/local/go/bin:$PATH CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations"
grep -rl --include='*_test.go' '^func Fuzz' pkg cmd | while read -r f; do
  dir=./$(dirname "$f")
  grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //' | while read -r target; do
    echo "== $dir $target ($time)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$time" -fuzzminimizetime 3s "$dir"
  done
done
