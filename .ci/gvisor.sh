#!/usr/bin/env bash
# Build gVisor's runsc and containerd-shim-runsc-v1 at the project's one gVisor pin
# (tests/cluster/tools/gvisor/go.mod, gVisor's generated `go` branch, plus PATCH.md beside it)
# and print their folder as the LAST line of stdout. Local sandboxes (`evalkube run`, via
# .ci/sandboxes.sh) and the real-node tier (tests/cluster/build-node.sh) both take runsc from
# here, so the two cannot drift apart.
#
# The binaries go to a cache OUTSIDE the work tree, keyed by the Go version, the pin's
# go.mod/go.sum, PATCH.md and this script:
#     ${EVALKUBE_GVISOR_CACHE:-$HOME/.cache/evalkube-gvisor}/<key>/bin
# `runsc --version` prints the pin's module version (set at link time): evalkube reads the
# date in it to refuse a runsc older than the pin (evalkube.sandbox.gvisor.MIN_RUNSC_DATE).
#
# Usage:
#   .ci/gvisor.sh                    build if needed; print the bin dir on stdout
#   .ci/gvisor.sh --print-if-cached  print the bin dir if built, else exit 1
#   .ci/gvisor.sh --key              print the cache key only
# Env: EVALKUBE_BUILD_P (go build -p, default 2), EVALKUBE_BUILD_NICE (default 10), GO.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PIN=$HERE/../tests/cluster/tools/gvisor
MODE=${1:-build}
if [[ -z ${GO:-} ]]; then
  if command -v go >/dev/null 2>&1; then GO=$(command -v go)
  elif [[ -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go
  else echo "gvisor.sh: no Go toolchain found (set GO=/path/to/go)" >&2; exit 2; fi
fi
export GOTOOLCHAIN=local CGO_ENABLED=0 GOWORK=off
export GOFLAGS="-mod=readonly -trimpath -buildvcs=false"

KEY=$({ "$GO" env GOVERSION GOOS GOARCH
        cat "$PIN/go.mod" "$PIN/go.sum" "$PIN/PATCH.md" "${BASH_SOURCE[0]}"; } | sha256sum | cut -c1-16)
ROOT=${EVALKUBE_GVISOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/evalkube-gvisor}
DIR=$ROOT/$KEY
BIN=$DIR/bin
complete() { [[ -x $1/runsc && -x $1/containerd-shim-runsc-v1 && -f $1/VERSION ]]; }

case $MODE in
  --key) echo "$KEY"; exit 0 ;;
  --print-if-cached)
    if complete "$BIN"; then echo "$BIN"; exit 0; fi
    echo "gvisor.sh: runsc not built for key $KEY (expected in $BIN)" >&2
    exit 1 ;;
  build) ;;
  *) echo "usage: $0 [--print-if-cached|--key]" >&2; exit 2 ;;
esac

if complete "$BIN"; then echo "$BIN"; exit 0; fi
mkdir -p "$DIR"
exec 9>"$DIR/lock"
if ! flock -n 9; then
  echo "gvisor.sh: another build of $KEY is running; waiting for it ..." >&2
  flock 9
fi
if complete "$BIN"; then echo "$BIN"; exit 0; fi

T0=$SECONDS
GV=$(cd "$PIN" && "$GO" list -m -f '{{.Version}}' gvisor.dev/gvisor)
(cd "$PIN" && "$GO" mod download gvisor.dev/gvisor)
SRC=$(cd "$PIN" && "$GO" list -m -f '{{.Dir}}' gvisor.dev/gvisor)
W=$DIR/build; rm -rf "$W"; mkdir -p "$W"
cp -r "$SRC" "$W/gvisor-src"; chmod -R u+w "$W/gvisor-src"
cp "$PIN/go.mod" "$PIN/go.sum" "$W/"
M=$W/gvisor-src/pkg/shim/v1/manager.go
OLD='		return shim.BootstrapParams{}, fmt.Errorf("failed to set OOM Score on shim: %w", err)'
# (ignored silently: containerd reads the shim's stdout AND stderr as its bootstrap answer)
NEW='		_ = err // tests/cluster/tools/gvisor/PATCH.md'
grep -qxF "$OLD" "$M" || { echo "gvisor.sh: PATCH.md no longer applies to $M" >&2; exit 1; }
python3 - "$M" "$OLD" "$NEW" <<'PY'
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
open(path, "w").write(text.replace(old + "\n", new + "\n", 1))
PY
(cd "$W" && "$GO" mod edit -replace gvisor.dev/gvisor=./gvisor-src)
echo "gvisor.sh: building runsc + containerd-shim-runsc-v1 at gvisor $GV ..." >&2
OUT=$W/out; mkdir -p "$OUT"
(cd "$W" && nice -n "${EVALKUBE_BUILD_NICE:-10}" "$GO" build -p "${EVALKUBE_BUILD_P:-2}" \
  -mod=mod -o "$OUT/" \
  -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$GV" \
  gvisor.dev/gvisor/runsc gvisor.dev/gvisor/shim)
mv "$OUT/shim" "$OUT/containerd-shim-runsc-v1"
{ echo "gvisor=$GV"; echo "go=$("$GO" env GOVERSION)"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) in $((SECONDS - T0))s"; } > "$OUT/VERSION"
rm -rf "$BIN" && mv "$OUT" "$BIN" && rm -rf "$W"
echo "gvisor.sh: built in $((SECONDS - T0))s: $BIN" >&2
# Prune: keep the newest ${EVALKUBE_TOOLS_KEEP:-3} builds, never one whose build is running.
n=0
while IFS= read -r v; do
  d=$(dirname "$(dirname "$v")")
  n=$((n + 1))
  ((n <= ${EVALKUBE_TOOLS_KEEP:-3})) && continue
  [[ $d == "$DIR" ]] && continue
  ( exec 8>"$d/lock" && flock -n 8 && rm -rf "$d" ) || true
done < <(ls -1t "$ROOT"/*/bin/VERSION 2>/dev/null)
echo "$BIN"
