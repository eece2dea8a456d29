#!/bin/sh
# Re-fetches the dashboard's charting library, uPlot (MIT), from the npm registry and checks it: the tarball's
# sha256 must be the pinned one (the registry's own sha512 integrity for this version is
# KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw==).
#
#   ./fetch-uplot.sh          compare the files in this folder with the tarball's (exit 1 when they differ)
#   ./fetch-uplot.sh --write  replace them with the tarball's
#
# The files are embedded in the binary (`include_str!` in faces/ui/assets.rs): the page needs no network.
set -eu
VERSION=1.6.32
SHA256=4b8a8191e425658e3ea8c8c1314b0fc679c861ee3a1af2b20c7b16ba50b5133d
FILES="LICENSE dist/uPlot.iife.min.js dist/uPlot.min.css"

here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
curl -fsSL -o "$work/uplot.tgz" "https://registry.npmjs.org/uplot/-/uplot-$VERSION.tgz"
echo "$SHA256  $work/uplot.tgz" | sha256sum -c - >/dev/null || {
    echo "uplot-$VERSION.tgz: sha256 is not $SHA256" >&2
    exit 1
}
tar -xzf "$work/uplot.tgz" -C "$work"
status=0
for f in $FILES; do
    name=$(basename "$f")
    if [ "${1:-}" = "--write" ]; then
        cp "$work/package/$f" "$here/$name"
    elif ! cmp -s "$work/package/$f" "$here/$name"; then
        echo "$name differs from uplot@$VERSION's $f" >&2
        status=1
    fi
done
[ "$status" = 0 ] && echo "uplot@$VERSION: LICENSE, uPlot.iife.min.js, uPlot.min.css as published"
exit $status
