#!/usr/bin/env bash
# Build promtool (Prometheus's rule checker and rule unit-test runner) from the Go module proxy
# and print the binary's path as the LAST line of stdout; everything else goes to stderr. The
# chart's PrometheusRule is checked and unit-tested with it (tests/unit/chart).
#
# The binary goes to a cache OUTSIDE the work tree, keyed by the module version, this script and
# the Go version, so a second run (or a fresh clone on the same machine, e.g. CI) is instant:
#     ${EVALKUBE_PROMTOOL_CACHE:-$HOME/.cache/evalkube-promtool}/<key>/promtool
#
#   BIN=$(bash .ci/promtool.sh | tail -n1) && export EVALKUBE_PROMTOOL_BIN=$BIN
set -euo pipefail
SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
# github.com/prometheus/prometheus v0.316.0 is Prometheus 3.16.0 (its VERSION file; Go module
# versions of Prometheus 3.x are v0.3MM.P).
VERSION=v0.316.0
RELEASE=3.16.0

source "$(dirname "$SCRIPT")/go-env.sh" "promtool.sh (building promtool)"
# `go install pkg@version` builds with the module's own go.mod/go.sum (checked against the
# checksum database), never the work tree's; GOFLAGS from the caller must not leak in.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOWORK=off GOFLAGS="-trimpath -buildvcs=false"

KEY=$({ go env GOVERSION GOOS GOARCH; echo "$VERSION"; cat "$SCRIPT"; } | sha256sum | cut -c1-16)
ROOT=${EVALKUBE_PROMTOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/evalkube-promtool}
DIR=$ROOT/$KEY
BIN=$DIR/promtool

if [[ ! -x $BIN ]]; then
  mkdir -p "$DIR"
  exec 9>"$DIR/lock"
  # one builder per key at a time (CI and a developer on one machine); flock is util-linux's
  if command -v flock >/dev/null 2>&1; then flock 9; fi
  if [[ ! -x $BIN ]]; then
    start=$SECONDS
    echo "promtool.sh: building promtool $VERSION with $(go version) (key $KEY) ..." >&2
    # remove_all_sd: no service-discovery plugins (the cloud SDKs are most of the build);
    # the tests check and unit-test rule files, which need none of them.
    GOBIN="$DIR/gobin" nice -n "${EVALKUBE_BUILD_NICE:-10}" \
      go install -p "${EVALKUBE_BUILD_P:-2}" -tags remove_all_sd \
      -ldflags "-s -w -X github.com/prometheus/common/version.Version=$RELEASE" \
      "github.com/prometheus/prometheus/cmd/promtool@$VERSION" >&2
    mv "$DIR/gobin/promtool" "$BIN"
    rmdir "$DIR/gobin"
    echo "promtool.sh: built in $((SECONDS - start))s" >&2
  fi
fi
"$BIN" --version 2>&1 | head -1 >&2
echo "$BIN"
