"""The hostile suite at the sandbox layer: each attack is a grader run on every backend that
claims to block it (``GraderSandbox`` directly: that is where containment lives).

Each test asserts that the attack failed (see ``attacks.py``), that the samples around it
were graded correctly, that the run completed, and that nothing was left behind: no
process, temp dir or cgroup of the sandbox. The end-to-end layer (``evalkube run``) is in
``test_hostile_suite_cli.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evalkube.sandbox import SandboxBackend
from evalkube.sandbox.backends import live_workers
from tests.integration.sandbox.support import (
    alive,
    backend,
    descendants,
    leftovers,
    require_cgroups,
    run,
)
from tests.security.attacks import ATTACKED, ATTACKS, EXPECTED, SAMPLES, Attack, grader_source
from tests.security.conftest import Listener

CASES = [
    pytest.param(attack, name, id=f"{attack.name}-{name}")
    for attack in ATTACKS
    for name in attack.blocked_by
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("attack", "backend_name"), CASES)
def test_attack_is_contained(
    attack: Attack,
    backend_name: str,
    listener: Listener,
    host_secrets: dict[str, str],
) -> None:
    sandbox_backend: SandboxBackend = backend(backend_name)
    if attack.needs_cgroups:
        require_cgroups(backend_name)
    params = {**host_secrets, "port": str(listener.port)}
    before = descendants(os.getpid())

    executions, _restarts = run(
        sandbox_backend, grader_source(attack, params), SAMPLES, timeout=attack.timeout
    )

    # The run completed: one outcome per sample, in order.
    assert [e.index for e in executions] == list(range(len(SAMPLES)))
    # The attack failed.
    attack.expect.check_execution(executions[ATTACKED], params["secret"])
    # The other samples were graded correctly (no forged or lost answers).
    for index, expected in EXPECTED.items():
        outcome = executions[index]
        assert (outcome.status, outcome.value) == ("returned", expected), (index, outcome)
    # Nothing the attack touched on the host changed.
    assert listener.accepted == 0
    assert not Path(host_secrets["host_file"]).exists()
    # Nothing was left behind.
    assert live_workers() == 0
    assert alive(descendants(os.getpid()) - before) == set()
    assert leftovers().empty, leftovers()
