#!/usr/bin/env bash
# Checks that src/sys.rs is exactly what regenerate.sh produces today: regenerates into a temporary folder and
# diffs. Exits 0 when identical, 1 with the diff when not.
#
# CI runs this only when asked, because it downloads a ~200 MB wheel and may build bindgen-cli:
#   HYPERCOMM_CHECK_BINDINGS=1 bash .ci/run
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$here/regenerate.sh" --out "$tmp"
if diff -u "$here/src/sys.rs" "$tmp/sys.rs"; then
    echo "check-regenerate: src/sys.rs is reproducible"
else
    echo "check-regenerate: src/sys.rs differs from a fresh regeneration (diff above)" >&2
    exit 1
fi
