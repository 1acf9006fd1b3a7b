"""Which local jobs got their first decision only after crux-run had stopped waiting for it.

crux-run waits, bounded by agent.start_wait_s, for a job's first whole decision before it
starts the job (cruxd/cli/start_wait.py). Past the bound it starts the job anyway, and the
connections the job makes at start-up stay unsteered. crux-run says so on the job's stderr;
this is the agent's side of it, for the operator: a counter (`cruxctl status`, metrics) and
one log line per such job. A job counts once, when its first non-provisional decision is
applied here; jobs kept across an agent restart were decided before it and do not count.
"""

from __future__ import annotations

from collections.abc import Iterable

from cruxd.control.records import JobAssignment


class FirstDecisions:
    def __init__(self) -> None:
        self._waiting: dict[str, float] = {}  # job id -> monotonic time it registered
        self.late = 0  # jobs whose first decision came after the bound, since the start

    def registered(self, job_id: str, now: float) -> None:
        self._waiting.setdefault(job_id, now)

    def gone(self, job_id: str) -> None:
        self._waiting.pop(job_id, None)

    def applied(self, jobs: Iterable[JobAssignment], bound_s: float, now: float
                ) -> list[tuple[str, float]]:
        """The jobs of a plan just applied whose first whole decision this is and came later
        than `bound_s` after they registered, with how long it took; counted in `late`."""
        late = []
        for a in jobs:
            since = None if a.provisional else self._waiting.pop(a.job_id, None)
            if since is not None and now - since > bound_s:
                late.append((a.job_id, now - since))
        self.late += len(late)
        return late
