"""A cancel that lands as the awaited event is set must still cancel the waiting task
(cruxd/waits.py). On Python 3.11 asyncio.wait_for swallows it; this is what kept a
deposed HA leader's planner running, and its standby naming itself as the active
leader, in a CI run."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import pytest

from cruxd.waits import cancelled, wait_event, within


async def _cancelled_as_set(wait: str) -> bool:
    """Whether a loop waiting on an event ends when cancelled in the turn the event is
    set."""
    ev = asyncio.Event()

    async def loop() -> None:
        while True:
            if wait == "wait_event":
                await wait_event(ev, 10)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ev.wait(), 10)
            ev.clear()
            await asyncio.sleep(0)
    task = asyncio.create_task(loop())
    await asyncio.sleep(0.01)
    ev.set()
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=1.0)
    if not done:  # it ran on: stop it for good (a second cancel lands)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return bool(done) and task.cancelled()


def test_wait_event_keeps_a_cancel_that_lands_as_the_event_is_set() -> None:
    assert asyncio.run(_cancelled_as_set("wait_event"))


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="wait_for was fixed in 3.12")
def test_the_311_wait_for_swallows_it() -> None:
    """The reason wait_event exists: if this starts failing, 3.11 got the fix too."""
    assert not asyncio.run(_cancelled_as_set("wait_for"))


def test_wait_event_reports_set_or_timed_out() -> None:
    async def run() -> tuple[bool, bool]:
        ev = asyncio.Event()
        timed_out = await wait_event(ev, 0.01)
        asyncio.get_running_loop().call_later(0.01, ev.set)
        return timed_out, await wait_event(ev, None)
    assert asyncio.run(run()) == (False, True)


def test_within_times_out_and_returns() -> None:
    async def run() -> int:
        with pytest.raises(TimeoutError):
            await within(asyncio.sleep(10), 0.01)
        return await within(asyncio.sleep(0, result=7), 1.0)
    assert asyncio.run(run()) == 7


def test_cancelled_cancels_again_a_task_that_swallowed_the_first() -> None:
    async def run() -> tuple[int, bool]:
        swallowed = 0

        async def stubborn() -> None:
            nonlocal swallowed
            while True:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    if swallowed:
                        raise
                    swallowed += 1
        task = asyncio.create_task(stubborn())
        await asyncio.sleep(0)
        await cancelled(task, "stubborn", every_s=0.01)
        return swallowed, task.cancelled()
    assert asyncio.run(run()) == (1, True)
