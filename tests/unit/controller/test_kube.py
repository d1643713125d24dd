"""``Kube.suite``: callers waiting for a request slot share one read, sent after each asked."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from evalkube.controller import kube as kube_module
from evalkube.controller.kube import Kube
from tests.unit.controller.fake_kube import api_error


class _Found(dict[str, Any]):
    def to_dict(self) -> dict[str, Any]:
        return dict(self)


class HeldClient:
    """A lightkube client whose GETs are answered only when the test says so; each answer
    carries the number of the GET that sent it."""

    def __init__(self) -> None:
        self.gets = 0
        self.answer = asyncio.Event()
        self.missing = False
        self.failing = False

    async def get(self, kind: Any, name: str, namespace: str) -> _Found:
        self.gets += 1
        sent = self.gets
        await self.answer.wait()
        if self.failing:
            raise api_error(500, "etcd is down")
        if self.missing:
            raise api_error(404, "not found")
        return _Found(metadata={"name": name, "namespace": namespace}, spec={"read": sent})


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _run(scenario: Callable[[Kube, HeldClient], Awaitable[None]], slots: int) -> None:
    """``scenario`` against a :class:`Kube` with ``slots`` requests in flight at most."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kube_module, "REQUESTS_IN_FLIGHT", slots)
        client = HeldClient()
        asyncio.run(scenario(Kube(client), client))  # type: ignore[arg-type]


async def _behind_a_busy_slot(
    kube: Kube, name: str, callers: int
) -> tuple[asyncio.Task[Any], list[asyncio.Task[Any]]]:
    """A run's GET holding the only request slot, and ``callers`` reads of suite ``name``
    waiting for it."""
    busy = asyncio.create_task(kube.run("ns", "other"))
    await _settle()
    readers = [asyncio.create_task(kube.suite("ns", name)) for _ in range(callers)]
    await _settle()
    return busy, readers


def test_callers_waiting_for_a_slot_share_one_read_each_with_a_copy_of_its_own() -> None:
    async def scenario(kube: Kube, client: HeldClient) -> None:
        busy, readers = await _behind_a_busy_slot(kube, "s", 5)
        assert client.gets == 1  # only the run's GET: the suite's waits for the slot
        client.answer.set()
        await busy
        found = await asyncio.gather(*readers)
        assert client.gets == 2  # one read for five callers
        assert all(
            f == {"metadata": {"name": "s", "namespace": "ns"}, "spec": {"read": 2}} for f in found
        )
        found[0]["spec"]["read"] = "changed by one caller"
        assert found[1]["spec"]["read"] == 2

    _run(scenario, slots=1)


def test_a_caller_that_asks_after_the_read_was_sent_gets_a_read_of_its_own() -> None:
    async def scenario(kube: Kube, client: HeldClient) -> None:
        first = asyncio.create_task(kube.suite("ns", "s"))
        await _settle()
        assert client.gets == 1  # sent: the suite may have changed since
        later = asyncio.create_task(kube.suite("ns", "s"))
        await _settle()
        assert client.gets == 2
        client.answer.set()
        assert (await first)["spec"]["read"] == 1
        assert (await later)["spec"]["read"] == 2
        assert (await kube.suite("ns", "s"))["spec"]["read"] == 3  # nothing kept after a read

    _run(scenario, slots=4)


def test_a_shared_read_tells_every_caller_the_suite_is_missing_or_the_error() -> None:
    async def scenario(kube: Kube, client: HeldClient) -> None:
        client.missing = True
        busy, readers = await _behind_a_busy_slot(kube, "gone", 3)
        client.answer.set()
        assert await busy is None
        assert await asyncio.gather(*readers) == [None, None, None]
        client.missing, client.failing = False, True
        client.answer.clear()
        readers = [asyncio.create_task(kube.suite("ns", "s")) for _ in range(3)]
        await _settle()
        client.answer.set()
        errors = await asyncio.gather(*readers, return_exceptions=True)
        assert [getattr(e, "status", None) and e.status.code for e in errors] == [500] * 3
        client.failing = False
        assert (await kube.suite("ns", "s"))["spec"]["read"] == client.gets  # a fresh read

    _run(scenario, slots=1)


def test_one_caller_cancelled_does_not_cancel_the_read_the_others_wait_for() -> None:
    async def scenario(kube: Kube, client: HeldClient) -> None:
        busy, (first, second) = await _behind_a_busy_slot(kube, "s", 2)
        first.cancel()  # the run that asked first was deleted
        await _settle()
        client.answer.set()
        await busy
        assert (await second)["spec"]["read"] == 2
        assert first.cancelled()

    _run(scenario, slots=1)
