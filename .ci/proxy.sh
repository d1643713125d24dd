#!/usr/bin/env bash
# Build the native model bridge proxy (operator/evalkube-proxy, Go) and print the binary's path
# as the LAST line of stdout; everything else goes to stderr. Runs its Go unit tests first
# (go vet + go test; Go's own test cache makes a repeat run take a second).
#
# The binary goes to a cache OUTSIDE the work tree, keyed by the Go sources, go.mod/go.sum, this
# script and the Go version, so a fresh clone on the same machine (CI) reuses it:
#     ${EVALKUBE_PROXY_CACHE:-$HOME/.cache/evalkube-proxy}/<key>/evalkube-proxy
#
#   BIN=$(bash .ci/proxy.sh | tail -n1) && export EVALKUBE_PROXY_BIN=$BIN
set -euo pipefail
SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
cd "$(dirname "$SCRIPT")/../operator/evalkube-proxy"

source "$(dirname "$SCRIPT")/go-env.sh" "proxy.sh (building evalkube-proxy)"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOWORK=off
# -mod=readonly: the committed go.sum must be complete; a mismatch fails loudly.
export GOFLAGS="-mod=readonly -trimpath -buildvcs=false"

KEY=$({ go env GOVERSION GOOS GOARCH; cat go.mod go.sum ./*.go "$SCRIPT"; } | sha256sum | cut -c1-16)
ROOT=${EVALKUBE_PROXY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/evalkube-proxy}
BIN=$ROOT/$KEY/evalkube-proxy

start=$SECONDS
go vet ./... >&2
go test ./... >&2
if [[ ! -x $BIN ]]; then
  mkdir -p "$ROOT/$KEY"
  go build -ldflags "-s -w -X main.version=$KEY" -o "$BIN.partial" . >&2
  mv "$BIN.partial" "$BIN"
fi
echo "proxy.sh: evalkube-proxy ready in $((SECONDS - start))s: $BIN" >&2
echo "$BIN"
