"""Wait until the work-unit pod's NetworkPolicy is enforced before grader code runs.

A CNI programs a NetworkPolicy some time after a Pod starts (kube-router: a few seconds), and
until then the pod's egress is open. The grader container shares the pod's network, so the
runner checks a *canary*: an address every pod may reach except work-unit pods (the egress
gateway's metrics port: its own policy admits anyone, the run's policy does not allow it).
While the canary answers, the run's policy is not in force yet, and the runner has sent the
grader neither code nor samples; once a connection is refused or times out, it goes on. A
CNI that never enforces NetworkPolicy fails the unit with a message saying so.
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
