#!/usr/bin/env bash
# Build SeaweedFS's `weed` binary (an S3-compatible object store; Apache-2.0) from the Go module
# proxy and print its path as the LAST line of stdout; everything else goes to stderr. The tests
# that read datasets from s3:// start it through tests/support/s3_server.py.
#
# The binary goes to a cache OUTSIDE the work tree, keyed by the module version, this script and
# the Go version, so a second run (or a fresh clone on the same machine, e.g. CI) is instant:
#     ${EVALKUBE_SEAWEEDFS_CACHE:-$HOME/.cache/evalkube-seaweedfs}/<key>/weed
#
#   BIN=$(bash .ci/seaweedfs.sh | tail -n1) && export EVALKUBE_WEED_BIN=$BIN
#
# `go install github.com/seaweedfs/seaweedfs/weed@VERSION` is refused: the module's go.mod has a
# replace directive (tyler-smith/go-bip39 => cosmos/go-bip39). So the build is a tiny module in a
# temp dir that requires seaweedfs at VERSION and repeats that replace; minimal version selection
# then picks exactly the versions seaweedfs's own go.mod lists, and `go get` checks every module
# against the checksum database. No build tags: SeaweedFS's optional backends (rclone, sqlite,
# tikv, ydb, elastic, ...) are the ones behind tags, so the default build is already the light one.
set -euo pipefail
SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
MODULE=github.com/seaweedfs/seaweedfs
# a pseudo-version of SeaweedFS's master of 2026-11-09 (weed/util/version: 4.53)
VERSION=v0.0.0-20261109003541-7506e5f91cd6
COMMIT=7506e5f91cd6

source "$(dirname "$SCRIPT")/go-env.sh" "seaweedfs.sh (building weed)"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOWORK=off GOFLAGS="-trimpath -buildvcs=false"

KEY=$({ go env GOVERSION GOOS GOARCH; echo "$MODULE@$VERSION"; cat "$SCRIPT"; } | sha256sum | cut -c1-16)
ROOT=${EVALKUBE_SEAWEEDFS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/evalkube-seaweedfs}
DIR=$ROOT/$KEY
BIN=$DIR/weed

if [[ ! -x $BIN ]]; then
  mkdir -p "$DIR"
  exec 9>"$DIR/lock"
  # one builder per key at a time (CI and a developer on one machine); flock is util-linux's
  if command -v flock >/dev/null 2>&1; then flock 9; fi
  if [[ ! -x $BIN ]]; then
    start=$SECONDS
    echo "seaweedfs.sh: building weed $VERSION with $(go version) (key $KEY) ..." >&2
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/evalkube-weed-build.XXXXXX")
    trap 'rm -rf "$WORK"' EXIT
    cat >"$WORK/go.mod" <<EOF
module evalkube.invalid/weed-build

go 1.26.6

require $MODULE $VERSION

// repeated from $MODULE's own go.mod (a dependency's replace directives do not apply)
replace github.com/tyler-smith/go-bip39 => github.com/cosmos/go-bip39 v1.0.0
EOF
    (cd "$WORK" && go get "$MODULE/weed@$VERSION") >&2
    echo "seaweedfs.sh: modules resolved in $((SECONDS - start))s; compiling ..." >&2
    (cd "$WORK" && nice -n "${EVALKUBE_BUILD_NICE:-10}" \
      go build -mod=readonly -p "${EVALKUBE_BUILD_P:-2}" \
      -ldflags "-s -w -X $MODULE/weed/util/version.COMMIT=$COMMIT" \
      -o "$BIN.partial" "$MODULE/weed") >&2
    mv "$BIN.partial" "$BIN"
    echo "seaweedfs.sh: built in $((SECONDS - start))s ($(du -h "$BIN" | cut -f1))" >&2
    # keep the newest three keys
    ls -1dt "$ROOT"/*/ 2>/dev/null | tail -n +4 | while read -r old; do
      [[ -x ${old}weed ]] && rm -rf "$old"
    done
  fi
fi
"$BIN" version 2>&1 | head -1 >&2
echo "$BIN"
