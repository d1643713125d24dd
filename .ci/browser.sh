#!/usr/bin/env bash
# Install headless Chromium and its WebDriver from Debian's packages when absent (idempotent).
# The HTML report test (tests/integration/reporting/test_report_browser.py) drives them with
# selenium to check what a person sees in `evalkube report`.
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "browser.sh: need root to install chromium chromium-driver" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
fi
chromium --version
