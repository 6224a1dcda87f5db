#!/usr/bin/env bash
# The dashboard's one third-party front-end library, uPlot (MIT), copied into api/ui/static/vendor/ from the
# npm registry's tarball of a pinned version whose sha512 is checked first. Its output is committed (two small
# files): run this again only to change the version (update VERSION and INTEGRITY together).
#   scripts/vendor-ui.sh           fetch, verify, copy
#   scripts/vendor-ui.sh --check   fetch, verify, and fail if the committed copies differ
set -euo pipefail

VERSION=1.6.32
INTEGRITY="sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=="
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/api/ui/static/vendor"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

cd "$WORK"
npm pack --silent "uplot@$VERSION" >/dev/null
TARBALL="uplot-$VERSION.tgz"
ACTUAL="sha512-$(openssl dgst -sha512 -binary "$TARBALL" | base64 -w0)"
if [ "$ACTUAL" != "$INTEGRITY" ]; then
    echo "uplot@$VERSION: integrity $ACTUAL, expected $INTEGRITY: not copied" >&2
    exit 1
fi
tar -xzf "$TARBALL"
FILES=(dist/uPlot.iife.min.js dist/uPlot.min.css LICENSE)
if [ "${1:-}" = "--check" ]; then
    diff -q package/dist/uPlot.iife.min.js "$DEST/uPlot.iife.min.js"
    diff -q package/dist/uPlot.min.css "$DEST/uPlot.min.css"
    diff -q package/LICENSE "$DEST/uPlot.LICENSE"
    echo "api/ui/static/vendor matches uplot@$VERSION"
    exit 0
fi
mkdir -p "$DEST"
cp package/dist/uPlot.iife.min.js package/dist/uPlot.min.css "$DEST/"
cp package/LICENSE "$DEST/uPlot.LICENSE"
echo "uplot@$VERSION ($INTEGRITY) -> $DEST"
