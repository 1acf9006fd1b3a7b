"""How often the leader re-planned, and why, and how often each job's decision changed.

A published plan that changes some job's decision (what its agents apply: state, level,
DSCP, routes; `plan_delta.decides`), or gives a job its first, or drops one, is a re-plan,
counted once per kind of cause it came from ("job arrived", "measurement changed", ...:
a cause up to its first colon). A plan that changes no decision (a rank shifting below an
arrival, a reprobe list) is counted apart: the jobs never see it. Every change to a job
that was in the plan before counts for that job; its first decision does not. A job that
left the plan keeps its count until the leader forgets the job (`forget`, with the jobs
its state still lists, expired ones for a while), so status shows a finished job's count
and the table stays bounded. `cruxctl status` and the leader's metrics show these.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

from cruxd.control.host_plans import PublishedPlan
from cruxd.control.plan_delta import decides


def cause_kind(cause: str) -> str:
    return cause.split(":", 1)[0].strip()


@dataclass
class ReplanStats:
    replans: Counter[str] = field(default_factory=Counter)  # by cause kind
    unchanged: int = 0  # plans published that changed no job's decision
    decision_changes: dict[str, int] = field(default_factory=dict)  # by job

    def record(self, old: PublishedPlan | None, new: PublishedPlan) -> list[str]:
        """Count `new`, published after `old`; return the jobs whose decision it changed."""
        before = {a.job_id: a for a in old.jobs} if old is not None else {}
        changed = []
        counts = {}
        for a in new.jobs:
            n = self.decision_changes.get(a.job_id, 0)
            b = before.get(a.job_id)
            if b is not None and decides(b) != decides(a):
                n += 1
                changed.append(a.job_id)
            counts[a.job_id] = n
        arrived_or_left = before.keys() != counts.keys()
        self.decision_changes = {**self.decision_changes, **counts}
        if changed or arrived_or_left:
            self.replans.update({cause_kind(c) for c in new.causes} or {"unknown"})
        else:
            self.unchanged += 1
        return changed

    def forget(self, known: Collection[str]) -> None:
        """Drop the counts of jobs no longer in `known` (the leader's job records)."""
        if any(j not in known for j in self.decision_changes):
            self.decision_changes = {j: n for j, n in self.decision_changes.items()
                                     if j in known}
