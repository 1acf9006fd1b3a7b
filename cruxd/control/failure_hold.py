"""After a failure, which agents the leader's one re-plan waits for (pure).

Agents find a failed link one sweep at a time, each on its own schedule; re-planning on
each report moved jobs once per report (four re-plans in the second after a spine cable
failed on the emulated testbed). When an agent's paths lose hops, the leader asks every
agent whose paths crossed them to probe again (`ClusterState.reprobe`) and holds the
re-plan until they have, or until `failure_settle_s` has passed since the first loss.

Waited for: tables last swept before the failure's first loss that have not lost hops
since (a sweep that did has seen the fabric without it). Not every outstanding request:
hops found lost later ask the same hosts again, and a host whose request did not change is
not sent it again (its plan did not change), so waiting for those waited the whole settle.
"""

from __future__ import annotations

from dataclasses import dataclass

from cruxd.control.cluster import ClusterState
from cruxd.control.replan_stats import cause_kind

PATHS_CHANGED = "path table changed"


@dataclass(frozen=True)
class Hold:
    start: float  # the failure's first loss (Unix s)
    until: float  # the longest the re-plan waits
    waiting: dict[str, tuple[str, ...]]  # host -> peers it has yet to probe again
    reprobe: dict[str, tuple[str, ...]]  # every request outstanding (the plan carries them)


def failure_hold(state: ClusterState, causes: list[str], now: float, settle_s: float,
                 since: float | None) -> Hold | None:
    """The hold for these causes, or None: re-plan now. `since`: the start of the failure
    already held for (down_hops' times move as other agents lose the same hops)."""
    recent = [at for at in state.down_hops.values() if now - at < settle_s]
    if not recent or any(cause_kind(c) != PATHS_CHANGED for c in causes):
        return None
    start = since if since is not None else min(recent)
    if now >= start + settle_s:
        return None
    reprobe = state.reprobe(now)
    waiting = {h: tuple(p for p in peers if (t := state.agents[h].paths.get(p)) is not None
                        and t.probed_unix_ms < start * 1000
                        and state.lost_at.get((h, p), -1.0) < start)
               for h, peers in reprobe.items()}
    waiting = {h: peers for h, peers in waiting.items() if peers}
    return Hold(start, start + settle_s, waiting, reprobe) if waiting else None
