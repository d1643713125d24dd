#!/usr/bin/env bash
# Build the two evalkube images WITHOUT a registry or a Docker engine, from the same Dockerfiles
# users build (operator/Dockerfile, sandbox_image/Dockerfile), plus the two small images a bare
# node needs (pause, busybox). Prints the directory holding them as the LAST line of stdout;
# everything else goes to stderr.
#
#   DIR=$(bash .ci/images.sh | tail -n1)   # DIR/{evalkube,evalkube-sandbox,pause,busybox}.tar
#
# Each tar is a docker-archive that `ctr -n k8s.io images import` (or `docker load`) takes:
#   localhost/evalkube:<appVersion>  localhost/evalkube-sandbox:<appVersion>   (Chart.yaml)
#   registry.k8s.io/pause:3.10       localhost/busybox:1.35
# Both evalkube images carry the chart's appVersion, the tag `image.tag` and `sandboxImage.tag`
# default to, so one version names the chart and its images.
#
# Bases: the Dockerfiles take `PYTHON_BASE` and `GO_BASE` build arguments; users get pinned
# registry tags (python:3.11-slim-bookworm, golang:1.26-bookworm). Here the bases are made
# locally: a Debian bookworm minbase rootfs (mmdebstrap) with python3 + pip, and the same with
# the machine's Go toolchain. The package list of the base is recorded beside the images
# (base-packages.txt); the base is rebuilt only when this script changes.
#
# Cache: ${EVALKUBE_IMAGES_CACHE:-$HOME/.cache/evalkube-images}/<key>, the key a hash of the
# base key, both Dockerfiles, every file copied into the images (tracked or new, not ignored)
# and the pause source: the grader environment's lock (sandbox_image/evalkube_sandbox/
# grader-env.lock.txt, installed into the grader image) is one of them. A second run with the
# same content returns at once.
#
# Needs (installed from Debian when missing): buildah, mmdebstrap, gcc, busybox-static.
set -euo pipefail
SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
cd "$(dirname "$SCRIPT")/.."
ROOT_DIR=$PWD
log() { echo "images.sh: $*" >&2; }

MODE=${1:-build}   # build | --key | --print-if-cached (never builds, installs nothing)
source .ci/go-env.sh "images.sh (the evalkube image builds evalkube-proxy with Go)"
missing=()
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
command -v gcc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
[[ -x /bin/busybox ]] || missing+=(busybox-static)
command -v flock >/dev/null 2>&1 || missing+=(util-linux)
if [[ $MODE == build ]] && ((${#missing[@]})); then
  log "installing ${missing[*]} from Debian"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}") >&2
fi

VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/evalkube/Chart.yaml)
[[ -n $VERSION ]] || { log "no appVersion in charts/evalkube/Chart.yaml"; exit 1; }
SUITE=bookworm
MIRROR=${EVALKUBE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE_PKGS=python3,python3-pip,python-is-python3,ca-certificates
GOROOT_DIR=$(go env GOROOT)
GOVER=$(go env GOVERSION)
# the pause container: the Kubernetes source the node tier pins (tests/cluster/tools/node-k8s)
K8S=$(cd tests/cluster/tools/node-k8s && GOFLAGS=-mod=readonly GOWORK=off go list -m -f '{{.Version}}' k8s.io/kubernetes)
PAUSE_C=$(cd tests/cluster/tools/node-k8s && GOFLAGS=-mod=readonly GOWORK=off go mod download -json k8s.io/kubernetes \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')/build/pause/linux/pause.c

BASE_KEY=$({ echo "$SUITE $BASE_PKGS $GOVER"; sed -n '/^# >>> base/,/^# <<< base/p' "$SCRIPT"; } | sha256sum | cut -c1-12)
# (a tracked file deleted in the work tree, not yet `git rm`ed, is left out)
FILES=$(git ls-files -co --exclude-standard -- operator sandbox_image pyproject.toml README.md \
        | grep -v -e '__pycache__' -e '\.pyc$' | LC_ALL=C sort \
        | while IFS= read -r f; do if [[ -e $f ]]; then echo "$f"; fi; done)
KEY=$({ echo "$BASE_KEY $VERSION $K8S"; cat "$SCRIPT" "$PAUSE_C"
        while IFS= read -r f; do echo "$f"; cat "$f"; done <<<"$FILES"; } | sha256sum | cut -c1-16)
CACHE=${EVALKUBE_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/evalkube-images}
OUT=$CACHE/$KEY
IMAGES=(evalkube evalkube-sandbox pause busybox)
complete() { local i; for i in "${IMAGES[@]}"; do [[ -s $OUT/$i.tar ]] || return 1; done; [[ -f $OUT/IMAGES ]]; }
[[ $MODE == --key ]] && { echo "$KEY"; exit 0; }
if complete; then log "images for $KEY are cached"; echo "$OUT"; exit 0; fi
[[ $MODE == --print-if-cached ]] && { log "no images built for key $KEY (expected in $OUT)"; exit 1; }

mkdir -p "$CACHE"
exec 9>"$CACHE/lock"          # one image build at a time on this machine (buildah storage is shared)
flock 9
if complete; then echo "$OUT"; exit 0; fi
T0=$SECONDS
WORK=$(mktemp -d "$CACHE/work.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
BA=(nice -n "${EVALKUBE_BUILD_NICE:-10}" buildah)
PY_BASE=localhost/evalkube-base-python:$SUITE-$BASE_KEY
GO_BASE=localhost/evalkube-base-go:$SUITE-$BASE_KEY

# >>> base (changing anything between these markers rebuilds the local base images)
if ! buildah inspect --type image "$PY_BASE" >/dev/null 2>&1 || ! buildah inspect --type image "$GO_BASE" >/dev/null 2>&1; then
  t=$SECONDS
  log "making the Debian $SUITE base (mmdebstrap minbase + $BASE_PKGS) ..."
  nice -n 10 mmdebstrap --quiet --variant=minbase --include="$BASE_PKGS" \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
    --customize-hook='chroot "$1" dpkg-query -W -f "\${Package}=\${Version}\n" > "$1"/.base-packages' \
    "$SUITE" "$WORK/base.tar" "$MIRROR" >&2
  c=$(buildah from scratch)
  buildah add --quiet "$c" "$WORK/base.tar" / >/dev/null
  # the machine's trust store: pip and go inside the build reach their registries through it
  buildah copy --quiet "$c" /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt >/dev/null
  buildah config --env LANG=C.UTF-8 --cmd /bin/bash "$c"
  buildah commit --quiet --rm "$c" "$PY_BASE" >/dev/null
  c=$(buildah from --pull-never "$PY_BASE")
  buildah copy --quiet "$c" "$GOROOT_DIR" /usr/local/go >/dev/null
  buildah config --env PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$c"
  buildah commit --quiet --rm "$c" "$GO_BASE" >/dev/null
  log "base images made in $((SECONDS - t))s"
fi
# <<< base
mkdir -p "$WORK/out"
c=$(buildah from --pull-never "$PY_BASE"); buildah run "$c" cat /.base-packages > "$WORK/out/base-packages.txt"; buildah rm "$c" >/dev/null

# the build context: exactly the files hashed into the key
CTX=$WORK/ctx; mkdir -p "$CTX"
while IFS= read -r f; do mkdir -p "$CTX/$(dirname "$f")"; cp -p "$f" "$CTX/$f"; done <<<"$FILES"

bud() {  # bud NAME CONTEXT DOCKERFILE
  local t=$SECONDS
  log "building localhost/$1:$VERSION from $3 ..."
  "${BA[@]}" bud --quiet --isolation chroot --network host --pull-never --layers=false \
    --build-arg PYTHON_BASE="$PY_BASE" --build-arg GO_BASE="$GO_BASE" \
    -f "$3" -t "localhost/$1:$VERSION" "$2" >&2
  buildah push --quiet "localhost/$1:$VERSION" "docker-archive:$WORK/out/$1.tar:localhost/$1:$VERSION" >&2
  log "built $1 in $((SECONDS - t))s ($(du -h "$WORK/out/$1.tar" | cut -f1))"
}
bud evalkube "$CTX" "$CTX/operator/Dockerfile"
bud evalkube-sandbox "$CTX/sandbox_image" "$CTX/sandbox_image/Dockerfile"

# pause: the sandbox container containerd starts first in every pod (Kubernetes' pause.c)
mkdir -p "$WORK/pause"; cp "$PAUSE_C" "$WORK/pause/pause.c"; chmod u+w "$WORK/pause/pause.c"
gcc -Os -Wall -Werror -static -DVERSION="$K8S-evalkube" -o "$WORK/pause/pause" "$WORK/pause/pause.c" && strip "$WORK/pause/pause"
c=$(buildah from scratch)
buildah copy --quiet "$c" "$WORK/pause/pause" /pause >/dev/null
buildah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
buildah commit --quiet --rm "$c" registry.k8s.io/pause:3.10 >/dev/null
buildah push --quiet registry.k8s.io/pause:3.10 "docker-archive:$WORK/out/pause.tar:registry.k8s.io/pause:3.10" >&2
# busybox: small test pods (Debian's static busybox)
BB=$WORK/bb; mkdir -p "$BB/bin" "$BB/tmp" "$BB/etc"; cp /bin/busybox "$BB/bin/"
for a in $(/bin/busybox --list); do [[ $a == busybox ]] || ln -s busybox "$BB/bin/$a"; done
echo 'nobody:x:65534:65534:nobody:/tmp:/bin/sh' > "$BB/etc/passwd"; chmod 1777 "$BB/tmp"
c=$(buildah from scratch)
buildah copy --quiet "$c" "$BB" / >/dev/null
buildah config --cmd /bin/sh "$c"
buildah commit --quiet --rm "$c" localhost/busybox:1.35 >/dev/null
buildah push --quiet localhost/busybox:1.35 "docker-archive:$WORK/out/busybox.tar:localhost/busybox:1.35" >&2

{ echo "key=$KEY"; echo "version=$VERSION"; echo "base=$PY_BASE $GO_BASE"
  echo "localhost/evalkube:$VERSION evalkube.tar"; echo "localhost/evalkube-sandbox:$VERSION evalkube-sandbox.tar"
  echo "registry.k8s.io/pause:3.10 pause.tar"; echo "localhost/busybox:1.35 busybox.tar"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) in $((SECONDS - T0))s"; } > "$WORK/out/IMAGES"
rm -rf "$OUT"; mv "$WORK/out" "$OUT"
log "images ready in $((SECONDS - T0))s: $OUT"
# images a rebuild untagged (older builds of the same tags) take space in buildah's storage
buildah rmi --prune >/dev/null 2>&1 || true
# keep the newest three image sets
ls -1dt "$CACHE"/*/IMAGES 2>/dev/null | tail -n +4 | while IFS= read -r f; do rm -rf "$(dirname "$f")"; done
echo "$OUT"
