"""Waiting on an event with a timeout, in loops whose task gets cancelled.

Not `asyncio.wait_for`: on Python 3.11 (Debian 12's), a cancel that lands in the same
loop turn as the awaited thing completes is swallowed (CPython gh-86296), so a task
cancelled then runs on. The HA leader met it: a planner woken by its 1 s retry as it was
being deposed kept planning, and `deactivate` waited on it for ever. `asyncio.timeout`
counts cancellations (Task.uncancel) and keeps an outside cancel.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

LOG = logging.getLogger(__name__)
T = TypeVar("T")


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until `event` is set or `timeout` s pass (None: no limit); whether it was set."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
        return True
    except TimeoutError:
        return False


async def within(step: Awaitable[T], timeout: float) -> T:
    """`step`'s result, or TimeoutError after `timeout` s."""
    async with asyncio.timeout(timeout):
        return await step


async def cancelled(task: asyncio.Task[Any] | None, what: str, every_s: float = 1.0) -> None:
    """Cancel `task` and wait until it has ended, cancelling again every `every_s` s if
    something in it swallowed the cancel (one swallowed cancel must not leave it running
    and the caller waiting for ever)."""
    if task is None:
        return
    task.cancel()
    while not task.done():
        await asyncio.wait([task], timeout=every_s)
        if not task.done():
            LOG.warning("%s ran on after being cancelled; cancelling it again", what)
            task.cancel()
    if not task.cancelled() and task.exception() is not None:
        LOG.warning("%s ended with %r", what, task.exception())
