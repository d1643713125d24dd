# Sourced by the CI scripts that build Go (.ci/cluster.sh, .ci/proxy.sh): put the preinstalled
# toolchain on PATH or fail with a message naming what needs it ($1).
if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
  export PATH=/usr/local/go/bin:$PATH
fi
if ! command -v go >/dev/null 2>&1; then
  echo "$1: no Go toolchain (expected /usr/local/go/bin/go; the module proxy must be reachable)" >&2
  exit 1
fi
