"""Wait until the work-unit pod's NetworkPolicy is enforced before grader code runs.

A CNI programs a NetworkPolicy some time after a Pod starts (kube-router: a few seconds), and
until then the pod's egress is open. The grader container shares the pod's network, so the
runner checks a *canary*: an address every pod may reach except work-unit pods (the egress
gateway's metrics port: its own policy admits anyone, the run's policy does not allow it).
While the canary answers, the run's policy is not in force yet, and the runner has sent the
grader neither code nor samples; once a connection is refused or times out, it goes on. A
CNI that never enforces NetworkPolicy fails the unit with a message saying so.

The canary is IPv4, as most CNIs' NetworkPolicy is, while gVisor serves IPv6 too: a pod whose
interface has a link-local IPv6 address reaches the node (kubelet, kube-proxy, the API server)
and the cluster DNS over it whatever the policy says. So the runner also looks for an IPv6
route (:func:`ipv6_routes`: link-local on every interface but loopback, and a global one) and,
unless told IPv6 is policed (``--ipv6 allow``), refuses to run grader code while one exists.
"""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

from evalkube import limits


class PolicyNotEnforced(RuntimeError):
    """The canary stayed reachable: the pod's NetworkPolicy is not enforced."""


def canary_reachable(url: str, timeout: float = 1.0) -> bool:
    """Whether a TCP connection to ``url``'s host and port succeeds."""
    parts = urlsplit(url)
    if not parts.hostname or parts.port is None:
        raise ValueError(f"policy canary {url!r} needs a host and a port")
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_enforced_policy(
    url: str,
    *,
    timeout: float = limits.POLICY_ENFORCED_TIMEOUT_SECONDS,
    interval: float = 0.5,
) -> float:
    """Return once ``url`` is unreachable (seconds waited); raise :class:`PolicyNotEnforced`
    when it is still reachable after ``timeout`` seconds."""
    started = time.monotonic()
    while canary_reachable(url):
        waited = time.monotonic() - started
        if waited >= timeout:
            raise PolicyNotEnforced(
                f"the work-unit pod still reaches {url} after {waited:.0f} s: its "
                "NetworkPolicy is not enforced, so grader code would have the pod's network. "
                "Use a CNI that enforces NetworkPolicy (Calico, Cilium, kube-router, ...), or "
                "turn the check off with the chart value egress.verifyPolicy=false "
                "(docs/security.md)"
            )
        time.sleep(interval)
    return time.monotonic() - started


class IPv6Present(RuntimeError):
    """The pod's network has IPv6 routes that its NetworkPolicy may not cover."""


#: Destinations tried on each interface: all-nodes multicast and a router-style link-local
#: address (no packet is sent: a UDP ``connect`` only chooses a route and a source address).
LINK_LOCAL_PROBES = ("ff02::1", "fe80::1")
#: A global destination (documentation prefix) for a default IPv6 route.
GLOBAL_PROBE = "2001:db8::1"


def _route(destination: str, scope: int = 0) -> str | None:
    """The source address a UDP socket would send to ``destination`` from, or ``None``."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
            probe.connect((destination, 9, 0, scope))
            source: str = probe.getsockname()[0]
            return source
    except OSError:  # no IPv6 at all, no address on the link, no route
        return None


def ipv6_routes() -> list[str]:
    """Every IPv6 path out of this network stack but loopback, as ``destination%link from
    source``; empty when IPv6 is off (the sysctl, or a CNI that gives pods no IPv6)."""
    found = []
    try:
        links = socket.if_nameindex()
    except OSError:
        links = []
    for index, name in links:
        if name == "lo":
            continue
        for destination in LINK_LOCAL_PROBES:
            if (source := _route(destination, index)) is not None:
                found.append(f"{destination}%{name} from {source}")
    if (source := _route(GLOBAL_PROBE)) is not None:
        found.append(f"{GLOBAL_PROBE} from {source}")
    return found


def refuse_ipv6() -> None:
    """Raise :class:`IPv6Present` when this pod has an IPv6 route (the grader would share it)."""
    routes = ipv6_routes()
    if routes:
        raise IPv6Present(
            "the work-unit pod has IPv6 routes (" + "; ".join(routes[:4]) + "), which "
            "NetworkPolicy may not police (link-local reaches the node and the cluster DNS): "
            "grader code does not run here. Let the kubelet allow the sysctl "
            "net.ipv6.conf.all.disable_ipv6 (allowedUnsafeSysctls) with the chart value "
            "work.ipv6=disable, keep pods IPv4-only in the CNI (work.ipv6=refuse), or, where "
            "the CNI enforces NetworkPolicy for IPv6, set work.ipv6=allow (docs/security.md)"
        )
