#!/usr/bin/env bash
# WordNet 3.0 from Debian, for `text_similarity` `meteor` (nltk reads it; pip cannot install
# it, and nltk's own downloader needs GitHub): wordnet-base (data and index files) and
# wordnet-sense-index (index.sense). Idempotent; without root it says what to run and carries
# on (only meteor needs it: evalkube validate names the same command).
set -euo pipefail
[[ -f /usr/share/wordnet/index.sense && -f /usr/share/wordnet/data.noun ]] && exit 0
if [[ $(id -u) -ne 0 ]]; then
  echo "wordnet.sh: meteor needs WordNet: sudo apt-get install wordnet-base wordnet-sense-index" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends wordnet-base wordnet-sense-index >/dev/null
