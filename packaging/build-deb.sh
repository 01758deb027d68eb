#!/bin/sh
# Build the .deb from the files git knows (committed or not, never ignored ones) in a
# scratch copy, so the checkout stays clean; copy the .deb and .changes to OUTDIR.
# Usage: packaging/build-deb.sh [OUTDIR]   (default: dist/); prints the .deb's path.
set -eu
top=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
out=$(realpath -m "${1:-$top/dist}")
work=$(mktemp -d "${TMPDIR:-/tmp}/gpuagent-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/src"
# --deduplicate: a file both staged and modified is listed once; deleted files are skipped.
git -C "$top" ls-files -z --cached --others --exclude-standard --deduplicate \
  | (cd "$top" && xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh) \
  | tar -C "$top" --null -T - -cf - | tar -C "$work/src" -xf -
# Debian's own python3 builds the package, not whatever python3 comes first in $PATH.
(cd "$work/src" && PATH=/usr/sbin:/usr/bin:/sbin:/bin dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1 \
  || { tail -n 40 "$work/build.log" >&2; echo "build-deb: dpkg-buildpackage failed" >&2; exit 1; }
mkdir -p "$out"
cp "$work"/*.deb "$work"/*.changes "$work"/*.buildinfo "$out"/
ls "$out"/gpuagent_*_all.deb
