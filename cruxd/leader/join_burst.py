"""Planning waits while many hosts join at once (a cluster-wide start, a mass re-join).

Each plan at start-up covers the hosts joined so far and is stale as soon as it is made,
and at 10,000 hosts each takes seconds with the GIL, while the loop that takes the joining
agents' calls waits: the calls queued past 30 s and a storm of retries followed
(docs/benchmarks.md, issue 34). So while hosts join faster than JOIN_BURST a second, the
leader plans nothing (JOIN_HOLD_MAX_S at most) and takes their calls; one plan follows the
burst. A few hosts joining, as in a small cluster or a host's restart, never hold a plan.
"""

from __future__ import annotations

from collections import deque

JOIN_BURST = 200  # hosts joined within JOIN_WINDOW_S that make a burst
JOIN_WINDOW_S = 1.0
JOIN_HOLD_MAX_S = 15.0  # a burst holds planning at most this long, then plans go as ever


class JoinBurst:
    """Join times (monotonic s) over the last window, at most JOIN_BURST of them."""

    def __init__(self) -> None:
        self._times: deque[float] = deque(maxlen=JOIN_BURST)
        self._since: float | None = None  # when the burst being held began

    def joined(self, now: float, hosts: int = 1) -> None:
        self._times.extend([now] * min(hosts, JOIN_BURST))

    def holding(self, now: float) -> float:
        """How long planning should wait now (0: plan); the planner looks again then."""
        while self._times and self._times[0] < now - JOIN_WINDOW_S:
            self._times.popleft()
        if len(self._times) < JOIN_BURST:
            self._since = None
            return 0.0
        if self._since is None:
            self._since = now
        left = self._since + JOIN_HOLD_MAX_S - now
        # the burst is over once the window drains: look again when its oldest join leaves
        return 0.0 if left <= 0 else min(left, self._times[0] + JOIN_WINDOW_S - now + 0.01)
