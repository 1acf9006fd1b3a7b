"""Delta fan-out: which hosts a new plan changes.

An arrival on four hosts of a 10,000-host cluster changes the decisions of the hosts that
share links with it, not of every host. The leader sends a full HostPlan only to hosts
whose decisions changed since the generation they hold, and every other host a small
watermark (HostPlan.unchanged) that advances its generation. For that, each plan carries,
per host, the generation at which its decisions last changed; what is not listed last
changed at the plan's `since`, the generation from which the record is complete.

A host's decisions are what its agent acts on: per job with a process there, its state
(profiling or not), level, DSCP and routes; the plan's levels and path selection; its
reprobe list. A job's rank, k_j, I_j and note are the leader's to show (cruxctl status asks
it), not the agent's to apply: an arrival shifts every rank below it, and marking hosts for
that sent nearly every host its whole plan on each arrival (bench/control_plane.py: 11,478
of 12,000).
A changed decision marks every host of the job, which is conservative: another host's
routes may be the same.
"""

from __future__ import annotations

from dataclasses import replace

from cruxd.control.host_plans import PublishedPlan
from cruxd.control.records import JobAssignment


def carry_changes(old: PublishedPlan | None, new: PublishedPlan) -> PublishedPlan:
    """`new` with its record of changes continued from `old`, the plan published before it
    (None: no record to continue; every host counts as changed)."""
    gen = new.generation
    if (old is None or old.levels != new.levels or old.path_selection != new.path_selection
            or not old.since or old.generation >= gen):  # a new mode changes every host
        return replace(new, since=gen, changed_at={})
    changed = dict(old.changed_at)
    before = {a.job_id: a for a in old.jobs}
    after = {a.job_id: a for a in new.jobs}
    for job_id in before.keys() | after.keys():
        a, b = before.get(job_id), after.get(job_id)
        if decides(a) != decides(b):
            for host in _hosts(a) | _hosts(b):
                changed[host] = gen
    for host in old.reprobe.keys() | new.reprobe.keys():
        if old.reprobe.get(host, ()) != new.reprobe.get(host, ()):
            changed[host] = gen
    return replace(new, since=old.since, changed_at=changed)


def changed_hosts(old: PublishedPlan, new: PublishedPlan) -> set[str]:
    """Hosts whose decisions `new` (continued from `old` by carry_changes) changes."""
    if new.since == new.generation:
        return {h for a in (*old.jobs, *new.jobs) for h in a.hosts} | set(new.reprobe) | {"*"}
    return {h for h, g in new.changed_at.items() if g == new.generation}


def decides(a: JobAssignment | None) -> tuple[object, ...] | None:
    return None if a is None else (a.state, a.level, a.dscp, a.hosts, a.routes)


def _hosts(a: JobAssignment | None) -> set[str]:
    return set(a.hosts) if a is not None else set()
