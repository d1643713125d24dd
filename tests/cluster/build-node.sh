#!/usr/bin/env bash
# Build the binaries of the real-node tier (tests/realnode) from the Go module proxy, each pinned
# by its own module under tests/cluster/tools/<tool>/ (go.mod + go.sum):
#   node-k8s     kubelet, kube-proxy (k8s.io/kubernetes, same versions as tools/k8s)
#   containerd   containerd, containerd-shim-runc-v2, ctr (containerd 2.x)
#   gvisor       runsc, containerd-shim-runsc-v1 (gVisor's `go` branch + tools/gvisor/PATCH.md),
#                built by .ci/gvisor.sh into its own cache, which local sandboxes share
#   kube-router  kube-router (its NetworkPolicy controller only)
#   coredns      coredns (the cluster DNS)
# The node also uses Debian's runc and CNI plugins (installed by .ci/realnode.sh).
#
# Binaries go to a cache OUTSIDE the work tree, keyed by a hash of those go.mod/go.sum files,
# this script, build-cache.sh and the Go version, exactly like tests/cluster/build-tools.sh:
#     ${EVALKUBE_NODE_CACHE:-$HOME/.cache/evalkube-realnode}/<key>/bin
# The Go module and build caches stay at their defaults, shared with build-tools.sh (kubelet
# reuses most of the control plane's compiled packages).
#
# Usage:
#   tests/cluster/build-node.sh                    build if needed; print the bin dir on stdout
#   tests/cluster/build-node.sh --print-if-cached  print the bin dir if complete, else exit 1
#   tests/cluster/build-node.sh --key              print the cache key only
# Env: EVALKUBE_BUILD_P (go build -p, default 2), EVALKUBE_BUILD_NICE (default 10), GO.
# Everything but the final bin dir goes to stderr.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOOLS=$HERE/tools
MODE=${1:-build}
SCRIPT=build-node.sh
MODULES=(node-k8s containerd gvisor kube-router coredns)
ALL=(kubelet kube-proxy containerd containerd-shim-runc-v2 ctr runsc containerd-shim-runsc-v1
     kube-router coredns)
# shellcheck source=tests/cluster/build-cache.sh
source "$HERE/build-cache.sh"

go_env
KEY=$({ echo "$GOVER"
        for t in "${MODULES[@]}"; do cat "$TOOLS/$t/go.mod" "$TOOLS/$t/go.sum"; done
        cat "$TOOLS/gvisor/PATCH.md" "${BASH_SOURCE[0]}" "$HERE/build-cache.sh" \
            "$HERE/../../.ci/gvisor.sh"; } \
      | sha256sum | cut -c1-16)
cache_open "$MODE" "$KEY" "${EVALKUBE_NODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/evalkube-realnode}" \
  "node binaries"
timed() {
  local name=$1 t0=$SECONDS; shift
  log "building $name (go build -p $P) ..."
  "$@"
  log "built $name in $((SECONDS - t0))s"
  echo "$name: $((SECONDS - t0))s" >> "$PART/TIMES"
}
gobuild() {  # gobuild MODULE_DIR -- go-build-args...   (binaries land in $PART)
  local mdir=$1; shift 2
  local tmp; tmp=$(mktemp -d "$DIR/tmp.XXXXXX")
  (cd "$mdir" && "${NICE[@]}" "$GO" build -p "$P" -o "$tmp/" "$@")
  mv -f "$tmp"/* "$PART/"
  rm -rf "$tmp"
}

T0=$SECONDS
# --- containerd ---------------------------------------------------------------------------------
CTRD=$(modver containerd github.com/containerd/containerd/v2)
if need containerd containerd-shim-runc-v2 ctr; then
  timed "containerd $CTRD" gobuild "$TOOLS/containerd" -- -tags "no_btrfs no_devmapper no_zfs" \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CTRD" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr
fi
# --- gVisor: the project's one runsc build (.ci/gvisor.sh; local sandboxes use the same) -------
GV=$(modver gvisor gvisor.dev/gvisor)
if need runsc containerd-shim-runsc-v1; then
  GVBIN=$(GO=$GO bash "$HERE/../../.ci/gvisor.sh" | tail -n1)
  cp -f "$GVBIN/runsc" "$GVBIN/containerd-shim-runsc-v1" "$PART/"
fi
# --- kube-router --------------------------------------------------------------------------------
KR=$(modver kube-router github.com/cloudnativelabs/kube-router/v2)
if need kube-router; then
  timed "kube-router $KR" gobuild "$TOOLS/kube-router" -- -ldflags "-s -w" \
    github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
fi
# --- CoreDNS ------------------------------------------------------------------------------------
CD=$(modver coredns github.com/coredns/coredns)
if need coredns; then
  timed "coredns $CD" gobuild "$TOOLS/coredns" -- -ldflags "-s -w" github.com/coredns/coredns
fi

# --- kubelet, kube-proxy (last: most packages are already compiled by build-tools.sh) ------------------------------------------------------------------
K8S=$(modver node-k8s k8s.io/kubernetes)
K8S_MAJOR=$(echo "${K8S#v}" | cut -d. -f1); K8S_MINOR=$(echo "$K8S" | cut -d. -f2)
if need kubelet kube-proxy; then
  LDF="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LDF+=" -X $p.gitVersion=$K8S -X $p.gitMajor=$K8S_MAJOR -X $p.gitMinor=$K8S_MINOR -X $p.gitTreeState=clean"
  done
  timed "kubelet+kube-proxy $K8S" gobuild "$TOOLS/node-k8s" -- -tags=selinux,notest,grpcnotrace \
    -ldflags="$LDF" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
fi
{ echo "key=$KEY"; echo "go=$GOVER"; echo "kubernetes=$K8S"; echo "containerd=$CTRD"
  echo "gvisor=$GV"; echo "kube-router=$KR"; echo "coredns=$CD"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) in $((SECONDS - T0))s"; } > "$PART/VERSIONS"
cache_close
