#!/usr/bin/env bash
# Install PostgreSQL server binaries from Debian's packages when absent (idempotent).
# The tests start their own throwaway cluster (tests/fixtures/postgres.py).
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql >/dev/null
fi
ls -d /usr/lib/postgresql/*/bin | tail -1
