"""A model-guided sweep: when the fabric's ECMP hash is known (probing/hashmodel.py), probe
one model-chosen source port per path index - N probes for N paths instead of the blind
sweep's ~N*H_N - and check the model against what the probes saw.

The check: N ports the model puts on N different next hops must come back with N
pairwise different hop signatures. Two ports with one signature prove the model wrong
(a wrong seed, field selection or N); an unanswered probe leaves a path unconfirmed.
Either way the blind `sweep()` takes over: it sees the guided ports' answers first
(replayed, not re-sent) and goes on over the other ports, so a wrong model costs about
what a blind sweep does.

`SweepResult.stopped`:
    "model"                  all N paths found with exactly the N model-chosen ports
    "model-mismatch:<why>"   two chosen ports shared a signature; <why> is the blind
                             sweep's own reason ("expected" | "quiet" | "budget" | "ports")
    "model-incomplete:<why>" a chosen port got no usable answer (or the model could not
                             reach every index within `sports`); then as above
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol

from probing.sweep import Prober, SweepResult, sweep
from transport.roce import ROCE_DPORT, ROCE_SPORTS


class PathModel(Protocol):
    def ports_per_path(self, src: str | int, dst: str | int, n: int,
                       sports: Iterable[int] = ..., dport: int = ...) -> dict[int, int]: ...


class _Replay:
    """Answers the guided ports from what they already returned (no second probe),
    and forwards every other port to the real prober."""

    def __init__(self, prober: Prober, seen: dict[int, tuple[str, ...] | None]) -> None:
        self.prober, self.seen = prober, seen
        self.calls = 0

    def trace(self, sport: int) -> tuple[str, ...] | None:
        self.calls += 1
        if sport in self.seen:
            return self.seen[sport]
        return self.prober.trace(sport)


def guided_sweep(prober: Prober, model: PathModel, peer_addr: str, src_addr: str,
                 n_paths: int, *, sports: Iterable[int] = ROCE_SPORTS,
                 dport: int = ROCE_DPORT, expected: int | None = None,
                 max_probes: int = 1024, miss: float = 1e-3, rate_pps: float = 0.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> SweepResult:
    """Probe `peer_addr` from one model-chosen port per path index (the model hashes the
    5-tuple from `src_addr`, this host's fabric address). On a mismatch or a silent
    probe, fall back to `sweep()` over the guided ports (replayed, not re-sent) and then
    the rest of `sports`, with `expected` (None: the quiet rule - the model that was
    wrong may have had N wrong too), `max_probes`, `miss` and `rate_pps` as in sweep()."""
    if n_paths < 1:
        raise ValueError("n_paths must be >= 1")
    ports = list(sports)
    chosen = model.ports_per_path(src_addr, peer_addr, n_paths, ports, dport)
    result = SweepResult(peer_addr)
    seen: dict[int, tuple[str, ...] | None] = {}
    interval = 1.0 / rate_pps if rate_pps > 0 else 0.0
    next_at = clock()
    for sport in list(chosen.values())[:max_probes]:
        if interval:
            delay = next_at - clock()
            if delay > 0:
                sleep(delay)
            next_at = max(next_at, clock()) + interval
        seen[sport] = hops = prober.trace(sport)
        result.probes_sent += 1
        if hops is None:
            result.unanswered += 1
        else:
            result.paths.setdefault(hops, []).append(sport)
    if len(chosen) == n_paths and result.unanswered == 0 and len(result.paths) == n_paths:
        result.stopped = "model"
        return result
    why = "model-mismatch" if len(result.paths) < len(seen) - result.unanswered \
        else "model-incomplete"
    # the blind sweep sees the guided ports first, so its quiet rule counts them; its
    # pacing skips them on a virtual clock (they were sent, paced, above)
    replay = _Replay(prober, seen)
    skew = [0.0]

    def vclock() -> float:
        return clock() + skew[0]

    def vsleep(delay: float) -> None:
        if replay.calls < len(seen):
            skew[0] += delay
        else:
            sleep(delay)

    order = [*seen, *(p for p in ports if p not in seen)]
    blind = sweep(replay, peer_addr, order, expected=expected, max_probes=max_probes,
                  miss=miss, rate_pps=rate_pps, clock=vclock, sleep=vsleep)
    blind.probes_sent = max(blind.probes_sent, len(seen))
    blind.unanswered = max(blind.unanswered, result.unanswered)
    blind.stopped = f"{why}:{blind.stopped}"
    return blind
