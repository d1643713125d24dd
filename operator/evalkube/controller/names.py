"""Deterministic names of everything the operator creates for an EvalRun.

Names derive from the run and unit ids only, so an operator restarted at any moment finds
(and never duplicates) what it created before.
"""

from __future__ import annotations

import hashlib

DOMAIN = "evalkube.io"
LABEL_RUN = f"{DOMAIN}/run"
LABEL_UNIT = f"{DOMAIN}/unit"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
ANNOTATION_UNIT_ID = f"{DOMAIN}/unit-id"
#: The EvalRun's full name on its Jobs (the ``run`` label holds at most 63 characters of it).
ANNOTATION_RUN = f"{DOMAIN}/run-name"
#: Kueue's label naming the LocalQueue of a Job (``spec.queueName``).
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
MANAGED_BY = "evalkube"
#: The labels of every work-unit Job as a selector the API server filters the operator's Job
#: watch by: without it kopf decodes every Job of the cluster before its own label filter.
UNIT_JOBS_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_RUN}"


def _short(value: str, size: int = 8) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:size]


def fit(base: str, suffix: str, limit: int = 63) -> str:
    """`base-suffix` within `limit` characters (a long base is cut and hashed)."""
    room = limit - len(suffix) - 1
    if len(base) > room:
        base = base[: room - 9].rstrip("-") + "-" + _short(base)
    return f"{base}-{suffix}"


def run_label(run_name: str) -> str:
    """The ``evalkube.io/run`` label value: the run's name, or for a name longer than a label
    value may be (63), its start and a hash of the whole (an EvalRun name may have 253)."""
    if len(run_name) <= 63:
        return run_name
    return f"{run_name[:52].rstrip('-.')}-{_short(run_name, 10)}"


def run_id(namespace: str, name: str, uid: str) -> str:
    """The store's run id for an EvalRun (its uid keeps re-created runs apart)."""
    return f"{namespace}.{name}.{uid[:8]}"


def job_name(run_name: str, unit_id: str) -> str:
    """The unit's Job (a DNS label: at most 63 characters)."""
    return fit(run_name, "u" + _short(unit_id, 10))


def prepare_job_name(run_name: str) -> str:
    """The run's prepare Job (pins its uri sources before units are planned)."""
    return fit(run_name, "prepare")


def snapshot_name(run_name: str) -> str:
    return fit(run_name, "snapshot", 253)


def token_secret_name(run_name: str) -> str:
    return fit(run_name, "ingest", 253)


def network_policy_name(run_name: str) -> str:
    return fit(run_name, "egress", 253)


def egress_grant_secret_name(run_name: str) -> str:
    """The Secret holding the run's egress grant (mounted into proxy containers only)."""
    return fit(run_name, "egress-grant", 253)
