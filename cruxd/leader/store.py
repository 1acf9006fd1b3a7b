"""The leader's state file: the cluster view and the current plan, so a restarted
leader resumes the same plan (same generation) instead of starting over.

Written by temp file + fsync + rename, so a crash leaves the old file or the new
one, never half of one. A file that does not decode is moved aside (kept for
people to inspect) and the leader starts empty; it never half-loads.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from cruxd.config.statefile import write_atomic
from cruxd.control.cluster import AgentRecord, ClusterState, JobRecord
from cruxd.control.codec import from_dict, to_dict
from cruxd.control.host_plans import PublishedPlan

LOG = logging.getLogger(__name__)
FORMAT = "crux-leader-state/1"
__all__ = ["load", "snapshot", "write_atomic"]


def snapshot(state: ClusterState, plan: PublishedPlan | None) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "agents": {h: to_dict(r) for h, r in state.agents.items()},
        "jobs": {j: to_dict(r) for j, r in state.jobs.items()},
        "plan": to_dict(plan) if plan is not None else None,
    }


def load(path: Path, state: ClusterState, now: float) -> PublishedPlan | None:
    """Fill `state` from the file; agents count as just heard from (they get a full
    agent timeout to report again before their jobs expire)."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        _set_aside(path, str(exc))
        return None
    try:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} file")
        agents = {h: from_dict(AgentRecord, r, f"$.agents.{h}")
                  for h, r in doc["agents"].items()}
        jobs = {j: from_dict(JobRecord, r, f"$.jobs.{j}") for j, r in doc["jobs"].items()}
        plan = from_dict(PublishedPlan, doc["plan"], "$.plan") if doc["plan"] else None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        _set_aside(path, str(exc))
        return None
    for rec in agents.values():
        rec.last_report = now
    state.agents, state.jobs = agents, jobs
    return plan


def _set_aside(path: Path, why: str) -> None:
    bad = path.with_suffix(path.suffix + ".corrupt")
    LOG.error("leader state %s unreadable (%s); moved to %s, starting empty", path, why, bad)
    try:
        os.replace(path, bad)
    except OSError as exc:
        LOG.error("cannot move %s aside: %s", path, exc.strerror)
