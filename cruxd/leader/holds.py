"""The leader's holds on a re-plan, and what each last said it waited for.

Two events reach the leader as several reports and would re-plan once per report: a
failure, found by each agent on its own sweep (control/failure_hold.py), and a multi-host
job arriving or leaving, reported by each of its hosts (control/job_hold.py). Each hold
keeps the event's start across planner wake-ups, so its bound counts from the first report,
and logs only when what it waits for changes.
"""

from __future__ import annotations

import logging

from cruxd.control.cluster import ClusterState
from cruxd.control.failure_hold import Hold, failure_hold
from cruxd.control.job_hold import JobHold, job_hold

LOG = logging.getLogger("cruxd.leader.service")  # one logger name for the planner's lines


class ReplanHolds:
    def __init__(self) -> None:
        self._failure_since: float | None = None  # the first loss of the failure held for
        self._failure_waiting: dict[str, tuple[str, ...]] = {}
        self._job_since: float | None = None  # the first report of the job event held for
        self._job_waiting: dict[str, str] = {}

    def failure(self, state: ClusterState, causes: list[str], now: float,
                settle_s: float) -> Hold | None:
        hold = failure_hold(state, causes, now, settle_s, self._failure_since)
        self._failure_since = hold.start if hold is not None else None
        if hold is not None and hold.waiting != self._failure_waiting:
            self._failure_waiting = hold.waiting
            LOG.info("after lost hops: re-plan held up to %.1f s more for %d host(s) to probe "
                     "again: %s", hold.until - now, len(hold.waiting),
                     ", ".join(f"{h}->{'/'.join(p)}" for h, p in sorted(hold.waiting.items())[:6]))
        return hold

    def job(self, state: ClusterState, causes: list[str], now: float,
            settle_s: float) -> JobHold | None:
        hold = job_hold(state, causes, now, settle_s, self._job_since)
        if (hold is None and self._job_waiting and self._job_since is not None
                and now >= self._job_since + settle_s):
            LOG.warning("re-planning without every host of %s: %.1f s (job_settle_s) passed",
                        ", ".join(sorted(self._job_waiting)) or "the job", settle_s)
        self._job_since = hold.start if hold is not None else None
        if hold is not None and hold.waiting != self._job_waiting:
            LOG.info("job event: re-plan held up to %.1f s more: %s", hold.until - now,
                     "; ".join(f"{j}: {w}" for j, w in sorted(hold.waiting.items())[:6]))
        self._job_waiting = hold.waiting if hold is not None else {}
        return hold
