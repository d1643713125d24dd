#!/usr/bin/env bash
# CI step for the real-node tier (tests/realnode): install the host packages the node needs,
# build (or find cached) the node binaries and the images, and print two lines LAST on stdout:
#   EVALKUBE_NODE_BIN=<dir>      (tests/cluster/build-node.sh)
#   EVALKUBE_IMAGES_DIR=<dir>    (.ci/images.sh)
# Everything else goes to stderr. Idempotent: warm caches return in seconds.
#
# Host facilities it cannot install (the tests name them and fail under CI): root, cgroup v1
# hierarchies for cpu/memory/pids/cpuset, the br_netfilter module, network namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/go-env.sh "realnode.sh (building the node binaries)"

pkgs=()
have() { command -v "$1" >/dev/null 2>&1; }
have ip || pkgs+=(iproute2)
have nsenter || pkgs+=(util-linux)
have iptables || pkgs+=(iptables)
have ipset || pkgs+=(ipset)
have conntrack || pkgs+=(conntrack)
have openssl || pkgs+=(openssl)
have buildah || pkgs+=(buildah)
have mmdebstrap || pkgs+=(mmdebstrap)
have gcc || pkgs+=(gcc libc6-dev)
[[ -x /usr/bin/runc ]] || pkgs+=(runc)
[[ -x /usr/lib/cni/bridge ]] || pkgs+=(containernetworking-plugins)
[[ -x /bin/busybox ]] || pkgs+=(busybox-static)
if ((${#pkgs[@]})); then
  echo "realnode.sh: installing ${pkgs[*]} from Debian" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}") >&2
fi
# the pods' bridge traffic must pass iptables (Service DNAT replies, NetworkPolicies)
[[ -d /proc/sys/net/bridge ]] || modprobe br_netfilter >&2 || true

start=$SECONDS
echo "realnode.sh: node binaries, cache key $(bash tests/cluster/build-node.sh --key)" >&2
NODE=$(bash tests/cluster/build-node.sh | tail -n1)
echo "realnode.sh: node binaries ready in $((SECONDS - start))s: $NODE" >&2
cat "$NODE/VERSIONS" >&2
start=$SECONDS
IMAGES=$(bash .ci/images.sh | tail -n1)
echo "realnode.sh: images ready in $((SECONDS - start))s: $IMAGES" >&2
echo "EVALKUBE_NODE_BIN=$NODE"
echo "EVALKUBE_IMAGES_DIR=$IMAGES"
