#!/usr/bin/env bash
# The MLflow tracking server the MLflow tests start on loopback (tests/support/mlflow_server.py):
# `mlflow` (the full package: server, UI, SQLite backend store) in a venv of its own OUTSIDE the
# work tree, so its many dependencies (pandas, pyarrow, scikit-learn, Flask, ...) never meet
# evalkube's. Keyed by the pin below and this script; prints the venv's bin folder as the LAST
# line of stdout (everything else on stderr). A second run with the same key returns at once.
# evalkube itself only needs the client (`mlflow-skinny`, the `mlflow` extra of pyproject.toml).
set -euo pipefail
SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
cd "$(dirname "$SCRIPT")/.."
log() { echo "mlflow.sh: $*" >&2; }

# keep in step with the mlflow-skinny range in pyproject.toml
PIN="mlflow==3.17.2"
KEY=$( { echo "$PIN"; cat "$SCRIPT"; } | sha256sum | cut -c1-16)
ROOT=${EVALKUBE_MLFLOW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/evalkube-mlflow}
DIR=$ROOT/$KEY
if [[ -f $DIR/.complete ]]; then
  log "cached: $DIR"
  echo "$DIR/venv/bin"
  exit 0
fi
mkdir -p "$ROOT"
exec 9>"$ROOT/lock"          # one creation at a time on this machine
flock 9
if [[ -f $DIR/.complete ]]; then echo "$DIR/venv/bin"; exit 0; fi
start=$SECONDS
rm -rf "$DIR"
mkdir -p "$DIR"
PY=${EVALKUBE_PYTHON:-python3}
log "installing $PIN into $DIR ..."
"$PY" -m venv "$DIR/venv"
"$DIR/venv/bin/python" -m pip install -q --disable-pip-version-check --no-input "$PIN" >&2
"$DIR/venv/bin/mlflow" --version >&2
touch "$DIR/.complete"
log "ready in $((SECONDS - start))s ($(du -sh "$DIR" | cut -f1))"
# keep the newest two
ls -1dt "$ROOT"/*/.complete 2>/dev/null | tail -n +3 | while IFS= read -r f; do rm -rf "$(dirname "$f")"; done
echo "$DIR/venv/bin"
