# Sourced by tests/cluster/build-tools.sh and tests/cluster/build-node.sh: the Go toolchain and
# its environment, the cache folder outside the work tree (one per key), one builder per key,
# and finishing a build (bin.partial becomes bin; old keys are pruned). The sourcing script
# sets SCRIPT (its name, for messages) and ALL (the binaries of a complete build); both
# scripts' cache keys include this file.

log() { echo "$SCRIPT: $*" >&2; }

# go_env: GO ($GO, else `go` on PATH, else /usr/local/go/bin/go), the build environment and
# GOVER (what of Go goes into the key).
go_env() {
  if [[ -z ${GO:-} ]]; then
    if command -v go >/dev/null 2>&1; then GO=$(command -v go)
    elif [[ -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go
    else log "no Go toolchain found (set GO=/path/to/go)"; exit 2; fi
  fi
  export GOTOOLCHAIN=local CGO_ENABLED=0 GOWORK=off
  # -mod=readonly: the committed go.sum files must be complete; a mismatch fails loudly instead
  # of rewriting files in the work tree.
  export GOFLAGS="-mod=readonly -trimpath -buildvcs=false"
  GOVER=$("$GO" env GOVERSION GOOS GOARCH | tr '\n' ' ')
}

modver() { (cd "$TOOLS/$1" && "$GO" list -m -f '{{.Version}}' "$2"); }
complete() { local b; for b in "${ALL[@]}"; do [[ -x $1/$b ]] || return 1; done; [[ -f $1/VERSIONS ]]; }
need() { local b; for b in "$@"; do [[ -x $PART/$b ]] || return 0; done; return 1; }

# cache_open MODE KEY ROOT WHAT: DIR=ROOT/KEY, BIN=DIR/bin. `--key` prints KEY, and
# `--print-if-cached` BIN if it is complete (else says WHAT is not built), and exit. A build
# exits printing BIN when it is complete; else it takes the key's lock (waiting for another
# builder of the key) and sets PART (the bin dir being built), P and NICE.
cache_open() {
  local mode=$1 what=$4
  KEY=$2
  ROOT=$3
  DIR=$ROOT/$KEY
  BIN=$DIR/bin
  case $mode in
    --key) echo "$KEY"; exit 0 ;;
    --print-if-cached)
      if complete "$BIN"; then echo "$BIN"; exit 0; fi
      log "$what not built for key $KEY (expected in $BIN)"
      exit 1 ;;
    build) ;;
    *) echo "usage: $0 [--print-if-cached|--key]" >&2; exit 2 ;;
  esac
  if complete "$BIN"; then echo "$BIN"; exit 0; fi
  mkdir -p "$DIR"
  # One builder per key at a time (a developer and CI on the same machine, or two shells).
  exec 9>"$DIR/lock"
  if ! flock -n 9; then
    log "another build of $KEY is running; waiting for it ..."
    flock 9
  fi
  if complete "$BIN"; then echo "$BIN"; exit 0; fi
  PART=$DIR/bin.partial      # survives a failed/interrupted run: finished tools are not rebuilt
  mkdir -p "$PART"
  P=${EVALKUBE_BUILD_P:-2}
  NICE=(nice -n "${EVALKUBE_BUILD_NICE:-10}")
}

# cache_close: once PART/VERSIONS is written, PART becomes BIN; keep the newest
# ${EVALKUBE_TOOLS_KEEP:-3} complete builds of ROOT (~400 MB each), skipping any key whose build
# is running (its lock is held); print BIN.
cache_close() {
  rm -rf "$BIN" && mv "$PART" "$BIN"
  log "done in $((SECONDS - T0))s: $BIN"
  local keep=${EVALKUBE_TOOLS_KEEP:-3} n=0 v d
  while IFS= read -r v; do
    d=$(dirname "$(dirname "$v")")
    n=$((n + 1))
    ((n <= keep)) && continue
    [[ $d == "$DIR" ]] && continue
    ( exec 8>"$d/lock" && flock -n 8 && rm -rf "$d" && log "pruned old build $d" ) || true
  done < <(ls -1t "$ROOT"/*/bin/VERSIONS 2>/dev/null)
  echo "$BIN"
}
