"""One epoch, component by component.

Jobs that share no link cannot slow each other down, so an epoch splits into
contention components (union of jobs over shared links) that are simulated
separately. A component's steady iteration rates depend only on its jobs, their
paths and the relative order of their levels; they are cached under that
signature, so an arrival or a departure re-simulates only the component it
touches. A new component is simulated exactly when the epoch is short, else for a
window whose steady rates are extrapolated (and cached).

Every component must stop at the same instant (the first departure), so a first
pass finds when each would stop, and a second pass advances all of them to the
earliest such time, reusing the first pass's work whenever it reached that far.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from cruxd.sim.engine import Engine, JobState, WindowResult

_EPS = 1e-9


@dataclass
class Advance:
    """What one component did over [now, stop): per job, in component order."""

    iterations: np.ndarray
    busy: np.ndarray
    link_bytes: np.ndarray  # over the engine's links
    finished: np.ndarray


@dataclass
class _Trial:
    stop: float  # when this component would end the epoch (a departure) or the epoch end
    states: list[JobState]  # after simulating up to `reached`
    result: WindowResult | None  # the simulated part, if any
    reached: float  # how far the simulation went
    rate: np.ndarray  # steady iterations per second (extrapolation), per job


class Component:
    def __init__(self, engine: Engine, states: list[JobState], budget_left: np.ndarray,
                 signature: Hashable, window: float) -> None:
        self.engine, self.states, self.budget_left = engine, states, budget_left
        self.signature, self.window = signature, window
        self._trial: _Trial | None = None

    def plan(self, now: float, end: float, cache: dict[Hashable, np.ndarray]) -> float:
        """First pass: when would this component stop the epoch? Real states untouched."""
        rate = cache.get(self.signature)
        if rate is None and len(self.states) == 1:
            rate = cache[self.signature] = self.engine.alone_rate()  # nobody to contend with
        if rate is not None:
            self._trial = _Trial(_finish(now, end, self.budget_left, rate), [], None, now, rate)
            return self._trial.stop
        copies = [dataclasses.replace(s) for s in self.states]
        horizon = min(end, now + self.window)
        res = self.engine.run(copies, now, horizon)
        rate = res.steady_rate()
        if horizon == now + self.window and not res.finished.any():
            cache[self.signature] = rate  # a full window: its rates describe the regime
        if res.finished.any() or res.end >= end - _EPS:
            stop = res.end
        else:
            stop = _finish(res.end, end, self.budget_left - res.iterations, rate)
        self._trial = _Trial(stop, copies, res, res.end, rate)
        return stop

    def advance(self, now: float, stop: float) -> Advance:
        """Second pass: move the real states to `stop` and report what happened: take
        over the first pass's simulated part (`_replay`), then extrapolate at the
        steady rates up to `stop` (`_extrapolate`)."""
        trial = self._trial
        assert trial is not None, "plan() first"
        if trial.result is not None and trial.reached > stop + _EPS:
            # another component stops the epoch earlier: simulate exactly up to there
            res = self.engine.run(self.states, now, stop)
            return Advance(res.iterations, res.busy, res.link_bytes, res.finished)
        adv, start = self._replay(trial, now)
        if stop > start + _EPS and not adv.finished.any():
            self._extrapolate(adv, trial.rate, start, stop)
        return adv

    def _replay(self, trial: _Trial, now: float) -> tuple[Advance, float]:
        """The first pass's simulated part, if any, made real; and where it ended."""
        n = len(self.states)
        adv = Advance(np.zeros(n), np.zeros(n), np.zeros(self.engine.m_bytes.shape[1]),
                      np.zeros(n, dtype=bool))
        if trial.result is None:
            return adv, now
        for real, done in zip(self.states, trial.states, strict=True):
            real.__dict__.update(done.__dict__)
        adv.iterations += trial.result.iterations
        adv.busy += trial.result.busy
        adv.link_bytes += trial.result.link_bytes
        adv.finished |= trial.result.finished
        return adv, trial.reached

    def _extrapolate(self, adv: Advance, rate: np.ndarray, start: float, stop: float) -> None:
        """Add [start, stop) at steady `rate`, shifting the states by its length."""
        eng = self.engine
        # what the iteration in flight has already booked (bytes sent, compute
        # done): a job that finishes inside the extrapolation counts it whole
        sent = np.array([1.0 - s.remaining if s.comm_at <= start else 0.0
                         for s in self.states])
        computed = np.array([max(0.0, min(start, s.start + c) - max(s.start, s.begin))
                             for s, c in zip(self.states, eng.compute_s, strict=True)])
        extra = rate * (stop - start)
        adv.iterations += extra
        adv.busy += extra * eng.compute_s * eng.gpus
        adv.link_bytes += extra @ eng.m_bytes
        for s, x in zip(self.states, extra, strict=True):
            s.shift(stop - start)
            s.iterations += float(x)
        adv.finished |= self.budget_left - adv.iterations <= 1e-6
        if adv.finished.any():
            adv.busy -= np.where(adv.finished, computed * eng.gpus, 0.0)
            adv.link_bytes -= np.where(adv.finished, sent, 0.0) @ eng.m_bytes


def _finish(now: float, end: float, left: np.ndarray, rate: np.ndarray) -> float:
    """The first time a job runs out of iterations at these rates, else `end`."""
    stop = end
    for lft, r in zip(left.tolist(), rate.tolist(), strict=True):
        if r > 0 and math.isfinite(lft):
            stop = min(stop, now + max(lft, 0.0) / r)
    return stop


def components(links_of: list[set[int]]) -> list[list[int]]:
    """Groups of job indices whose link sets connect (union-find over shared links)."""
    parent = list(range(len(links_of)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[int, int] = {}
    for i, links in enumerate(links_of):
        for link in links:
            j = owner.setdefault(link, i)
            if j != i:
                parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(links_of)):
        groups.setdefault(root(i), []).append(i)
    return list(groups.values())
