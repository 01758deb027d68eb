#!/bin/sh
# Build the .debs (gpuagent and gpuagent-prometheus, the alert rules and dashboard for the
# Prometheus server) from the files git knows (committed or not, never ignored ones) in a
# scratch copy, so the checkout stays clean; copy them and the .changes to OUTDIR.
# Usage: packaging/build-deb.sh [OUTDIR]   (default: dist/); prints gpuagent's .deb's path
# (gpuagent-prometheus's lies beside it, same version).
# The version is the release's on its tag, NEXT~gitN.HASH[.dirty] on the way to the next
# release (debian/changelog's top entry, untagged), RELEASE+gitN.HASH[.dirty] after a tagged
# top entry (gpuagent/version.py says how); GPUAGENT_VERSION=V builds version V instead.
# Needs git, dpkg-dev and the Build-Depends of debian/control.
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
# One version for the .deb (what apt compares) and the code (gpuagent --version).
version=${GPUAGENT_VERSION:-$(cd "$top" && /usr/bin/python3 -m gpuagent.version)}
release=$(cd "$work/src" && dpkg-parsechangelog -S Version)
printf '# Written by packaging/build-deb.sh.\nVERSION = "%s"\n' "$version" >"$work/src/gpuagent/_build.py"
commit=$(git -C "$top" rev-parse --short=7 HEAD)
case $version in
"$release") ;;
"$release~"*)
  # On the way to the top entry's release: that entry, and NEWS's if it is the same, are
  # this build's, so an upgrade from the last release shows them (apt-listchanges shows
  # the entries above the installed version) and the changelog's versions only go up.
  for f in changelog NEWS; do
    awk -v r="$release" -v v="$version" -v c="$commit" -v f="$f" '
      NR == 1 && index($0, "gpuagent (" r ") ") == 1 {
        print "gpuagent (" v ")" substr($0, length("gpuagent (" r ")") + 1); getline; print
        if (f == "changelog") print "  * Build of commit " c ", on the way to " r ": not the release."
        next
      }
      { print }' "$work/src/debian/$f" >"$work/$f"
    mv "$work/$f" "$work/src/debian/$f"
  done
  ;;
*)
  # After a release (or GPUAGENT_VERSION): an entry of its own, dated like its commit.
  maintainer=$(cd "$work/src" && dpkg-parsechangelog -S Maintainer)
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
  ;;
esac
# Debian's own python3 builds the package, not whatever python3 comes first in $PATH.
(cd "$work/src" && PATH=/usr/sbin:/usr/bin:/sbin:/bin dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1 \
  || { tail -n 40 "$work/build.log" >&2; echo "build-deb: dpkg-buildpackage failed" >&2; exit 1; }
mkdir -p "$out"
cp "$work"/*.deb "$work"/*.changes "$work"/*.buildinfo "$out"/
ls "$out/gpuagent_${version}_all.deb"
