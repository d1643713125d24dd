#!/usr/bin/env bash
# Run the whole test suite (called by `make test`). The slow builds only some tests need (the
# control plane, the real node and its images, promtool, the MLflow venv, SeaweedFS) start at
# once in the background, niced, and the tests run in three phases as their builds arrive:
#
#   1. every test that needs none of them (marker `builds` absent: tests/conftest.py marks a
#      test by the fixtures it uses), while everything builds beside it;
#   2. the tests that need the control plane, promtool, MLflow or SeaweedFS, but no real node,
#      while the node binaries and images build;
#   3. the real-node tier (marker `realnode`).
#
# With warm caches every build returns in seconds and the phases simply run one after the
# other; a cold machine hides most of its builds behind phases 1 and 2 (docs/development.md,
# "CI time"). Every phase runs even when an earlier one failed; the exit status is the first
# failure's. Arguments (`make nightly`) run one pytest over them after every build.
set -euo pipefail
cd "$(dirname "$0")/.."
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
declare -A JOBS
start() { local name=$1; shift; "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.err" & JOBS[$name]=$!; }
collect() {  # sets RESULT to the job's last line of stdout; a failed build stops the run
  local name=$1 status=0
  wait "${JOBS[$name]}" || status=$?
  cat "$LOGS/$name.err" >&2
  if ((status)); then echo "test.sh: $name failed (exit $status)" >&2; exit "$status"; fi
  RESULT=$(tail -n1 "$LOGS/$name.out")
}
start promtool bash .ci/promtool.sh
start mlflow bash .ci/mlflow.sh
start seaweedfs bash .ci/seaweedfs.sh
# the node builds after the control plane (both compile Kubernetes: Go's build cache then
# compiles each package once); the control plane's directory is written as soon as it is ready
start cluster bash -c 'trap "touch \"$0.exit\"" EXIT; set -eo pipefail
  bash .ci/cluster.sh | tail -n1 >"$0"; bash .ci/realnode.sh' "$LOGS/ctrlplane.out"
# The native model bridge proxy (Go, ~20 s cold): its unit tests run here, and the proxy tests
# (phase 1) run every case against it as well as against the Python proxy.
EVALKUBE_PROXY_BIN=$(bash .ci/proxy.sh | tail -1)
export EVALKUBE_PROXY_BIN

failed=0
phase() {  # phase NAME pytest-args...: the slowest tests named in every CI log
  local name=$1 t0=$SECONDS status=0; shift
  echo "test.sh: phase $name" >&2
  .venv/bin/python -m pytest --durations=30 "$@" || status=$?
  echo "test.sh: phase $name ended in $((SECONDS - t0))s (exit $status)" >&2
  # 5: no test selected (a phase can be empty)
  if ((status && status != 5 && !failed)); then failed=$status; fi
}
tools() {
  # promtool checks and unit-tests the chart's alert rules and the dashboard's queries.
  collect promtool && export EVALKUBE_PROMTOOL_BIN=$RESULT
  # The MLflow tracking server the tracking tests start (a venv of its own, cached by its pin).
  collect mlflow && export EVALKUBE_MLFLOW_BIN=$RESULT
  # SeaweedFS's weed: the S3-compatible store the s3:// dataset tests read from.
  collect seaweedfs && export EVALKUBE_WEED_BIN=$RESULT
  # the control plane for the cluster tests (a failed build ends the run here)
  until [[ -s $LOGS/ctrlplane.out || -e $LOGS/ctrlplane.out.exit ]]; do sleep 2; done
  [[ -s $LOGS/ctrlplane.out ]] || collect cluster
  EVALKUBE_CTRLPLANE_BIN=$(cat "$LOGS/ctrlplane.out")
  export EVALKUBE_CTRLPLANE_BIN
}
node() {  # the real-node tier: node binaries and images (tests/realnode)
  collect cluster
  while IFS= read -r line; do
    case $line in EVALKUBE_NODE_BIN=*|EVALKUBE_IMAGES_DIR=*) export "${line?}" ;; esac
  done <"$LOGS/cluster.out"
}

if (($#)); then
  tools && node
  rm -rf "$LOGS"
  exec .venv/bin/python -m pytest --durations=30 "$@"
fi
phase "1 of 3 (no builds)" -m "not builds"
tools
phase "2 of 3 (control plane, promtool, MLflow, SeaweedFS)" -m "builds and not realnode"
node
phase "3 of 3 (the real node)" -m "realnode"
exit "$failed"
