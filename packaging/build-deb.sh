#!/bin/sh
# Build the .deb from the files git knows (committed or not, never ignored ones) in a
# scratch copy, so the checkout stays clean; copy the .deb and .changes to OUTDIR.
# Usage: packaging/build-deb.sh [OUTDIR]   (default: dist/); prints the .deb's path.
# The version is the release's (debian/changelog's top entry) on the release commit, and
# RELEASE+gitN.HASH[.dirty] after it (gpuagent/version.py says how); GPUAGENT_VERSION=V
# builds version V instead. Needs git, dpkg-dev and the Build-Depends of debian/control.
set -eu
# Say what is missing before a build that would stop half-way on a missing tool.
for tool in git dpkg-parsechangelog dpkg-buildpackage dh; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "build-deb.sh: $tool not found: install dpkg-dev, debhelper and the Build-Depends" \
      "of debian/control (scripts/setup --dev does)" >&2
    exit 1
  fi
done
top=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
out=$(realpath -m "${1:-$top/dist}")
work=$(mktemp -d "${TMPDIR:-/tmp}/gpuagent-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/src"
# --deduplicate: a file both staged and modified is listed once; deleted files are skipped.
git -C "$top" ls-files -z --cached --others --exclude-standard --deduplicate \
  | (cd "$top" && xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh) \
  | tar -C "$top" --null -T - -cf - | tar -C "$work/src" -xf -
# One version for the .deb (what apt compares) and the code (gpuagent --version): a build
# between releases gets a changelog entry of its own, dated like its commit.
version=${GPUAGENT_VERSION:-$(cd "$top" && /usr/bin/python3 -m gpuagent.version)}
release=$(cd "$work/src" && dpkg-parsechangelog -S Version)
printf '# Written by packaging/build-deb.sh.\nVERSION = "%s"\n' "$version" >"$work/src/gpuagent/_build.py"
if [ "$version" != "$release" ]; then
  maintainer=$(cd "$work/src" && dpkg-parsechangelog -S Maintainer)
  commit=$(git -C "$top" rev-parse --short=7 HEAD)
  # The commit's time, but later than the release's entry (uncommitted, it may be newer).
  when=$(git -C "$top" log -1 --format=%ct)
  released=$(cd "$work/src" && dpkg-parsechangelog -S Timestamp)
  [ "$when" -gt "$released" ] || when=$((released + 1))
  date=$(date -R -u -d "@$when")
  { printf 'gpuagent (%s) unstable; urgency=medium\n\n' "$version"
    printf '  * Build of commit %s, after release %s.\n\n' "$commit" "$release"
    printf ' -- %s  %s\n\n' "$maintainer" "$date"
    cat "$work/src/debian/changelog"; } >"$work/changelog"
  mv "$work/changelog" "$work/src/debian/changelog"
fi
# Debian's own python3 builds the package, not whatever python3 comes first in $PATH.
(cd "$work/src" && PATH=/usr/sbin:/usr/bin:/sbin:/bin dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1 \
  || { tail -n 40 "$work/build.log" >&2; echo "build-deb: dpkg-buildpackage failed" >&2; exit 1; }
mkdir -p "$out"
cp "$work"/*.deb "$work"/*.changes "$work"/*.buildinfo "$out"/
ls "$out/gpuagent_${version}_all.deb"
