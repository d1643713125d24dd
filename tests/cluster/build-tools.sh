#!/usr/bin/env bash
# Build the control-plane binaries used by the cluster tests (tests/cluster) from the Go
# module proxy: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (k8s.io/kubernetes),
# etcd, helm (v3) and kwok -- each pinned by its own module under tests/cluster/tools/<tool>/.
#
# Binaries go to a cache OUTSIDE the work tree, keyed by a hash of the tools' go.mod/go.sum,
# this script, build-cache.sh (shared with build-node.sh) and the Go version:
#     ${EVALKUBE_TOOLS_CACHE:-$HOME/.cache/evalkube-ctrlplane}/<key>/bin
# so a second run (or a fresh clone on the same machine, e.g. CI) is instant. The Go module and
# build caches stay at their defaults (outside the tree), so a rebuild on a warm machine is fast.
#
# Usage:
#   tests/cluster/build-tools.sh                    build if needed; print the bin dir on stdout
#   tests/cluster/build-tools.sh --print-if-cached  print the bin dir if complete, else exit 1
#                                                   (never builds; used by the pytest plugin)
#   tests/cluster/build-tools.sh --key              print the cache key only
#
# Env: EVALKUBE_TOOLS_CACHE (cache root), EVALKUBE_BUILD_P (go build -p, default 2),
#      EVALKUBE_BUILD_NICE (nice level, default 10), GO (go binary).
# Everything but the final bin dir goes to stderr.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOOLS=$HERE/tools
MODE=${1:-build}
SCRIPT=build-tools.sh
ALL=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd helm kwok)
# shellcheck source=tests/cluster/build-cache.sh
source "$HERE/build-cache.sh"

go_env
KEY=$({ echo "$GOVER"
        for t in k8s etcd helm kwok; do cat "$TOOLS/$t/go.mod" "$TOOLS/$t/go.sum"; done
        cat "${BASH_SOURCE[0]}" "$HERE/build-cache.sh"; } | sha256sum | cut -c1-16)
cache_open "$MODE" "$KEY" "${EVALKUBE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/evalkube-ctrlplane}" \
  "control-plane binaries"
modtime() { (cd "$TOOLS/$1" && "$GO" list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' "$2"); }
timed() {  # timed NAME cmd...   -- runs cmd, logs wall time
  local name=$1 t0=$SECONDS; shift
  log "building $name (go build -p $P) ..."
  "$@"
  log "built $name in $((SECONDS - t0))s"
}
# go build -o into a temp dir, then move binaries into $PART (never leaves a half-written binary)
gobuild() {  # gobuild TOOLDIR OUT_NAMES... -- go-build-args...
  local tdir=$1; shift
  local outs=()
  while [[ $1 != -- ]]; do outs+=("$1"); shift; done; shift
  local tmp; tmp=$(mktemp -d "$DIR/tmp.XXXXXX")
  (cd "$TOOLS/$tdir" && "${NICE[@]}" "$GO" build -p "$P" -o "$tmp/" "$@")
  local o; for o in "${outs[@]}"; do mv -f "$tmp/$o" "$PART/$o"; done
  rm -rf "$tmp"
}

T0=$SECONDS
# --- Kubernetes ---------------------------------------------------------------------------------
K8S=$(modver k8s k8s.io/kubernetes)                 # e.g. v1.36.3
K8S_MAJOR=$(echo "${K8S#v}" | cut -d. -f1); K8S_MINOR=$(echo "$K8S" | cut -d. -f2)
K8S_DATE=$(modtime k8s k8s.io/kubernetes); K8S_DATE=${K8S_DATE:-1970-01-01T00:00:00Z}
if need kube-apiserver kube-controller-manager kube-scheduler kubectl; then
  LDF="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LDF+=" -X $p.gitVersion=$K8S -X $p.gitMajor=$K8S_MAJOR -X $p.gitMinor=$K8S_MINOR"
    LDF+=" -X $p.gitTreeState=clean -X $p.buildDate=$K8S_DATE"
  done
  # the same build tags as Kubernetes' own release build (hack/lib/golang.sh)
  timed "kubernetes $K8S" gobuild k8s kube-apiserver kube-controller-manager kube-scheduler kubectl -- \
    -tags=selinux,notest,grpcnotrace -ldflags="$LDF" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
fi
# --- etcd ---------------------------------------------------------------------------------------
ETCD=$(modver etcd go.etcd.io/etcd/server/v3)
if need etcd; then
  timed "etcd $ETCD" gobuild etcd server -- \
    -ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=module-$ETCD" go.etcd.io/etcd/server/v3
  mv -f "$PART/server" "$PART/etcd"
fi
# --- helm ---------------------------------------------------------------------------------------
HELM=$(modver helm helm.sh/helm/v3)
if need helm; then
  HLDF="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  # helm's default .Capabilities.KubeVersion and deprecation lint target: the Kubernetes we run
  for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    HLDF+=" -X $p.k8sVersionMajor=$K8S_MAJOR -X $p.k8sVersionMinor=$K8S_MINOR"
  done
  timed "helm $HELM" gobuild helm helm -- -ldflags="$HLDF" helm.sh/helm/v3/cmd/helm
fi
# --- kwok ---------------------------------------------------------------------------------------
KWOK=$(modver kwok sigs.k8s.io/kwok)
if need kwok; then
  timed "kwok $KWOK" gobuild kwok kwok -- \
    -ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK#v} -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${K8S#v}" \
    sigs.k8s.io/kwok/cmd/kwok
fi

{ echo "key=$KEY"; echo "go=$GOVER"; echo "kubernetes=$K8S"; echo "etcd=$ETCD"; echo "helm=$HELM"; echo "kwok=$KWOK"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) in $((SECONDS - T0))s"; } > "$PART/VERSIONS"
cache_close
