"""Churn on the emulated testbed: jobs arriving and leaving, and a leaf-spine cable
failing, in the middle of a run.

`JobChurn` starts each job whose scenario entry has `arrival_s` that many seconds after
the measured window opens, and stops each job with `iterations` once it has done that
many inside the window (SIGTERM: its ranks end after the current iteration). With a
leader to ask, it times each event to the leader's plan that took it in: the arrival
scheduled with its TCP ports, the leaver gone.

`LinkDown` takes the cable down (`Fabric.set_link`, which also converges routing the
way the fabric's BGP would) `at_s` seconds into the measuring window. With a leader
to ask, `fail_link` then polls it until the plan's routes differ from those in force
when the cable went: the agents' re-verification sweeps find the lost paths, the
leader re-plans around them. `recovery` reads, from the jobs' own iteration logs,
when each job's iterations were back at the steady state they reached afterwards.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cruxd.errors import UsageError
from cruxd.model.topology import NodeKind, Topology, TopologyBuilder
from tests.rig.fabric import Fabric
from tests.rig.testbed_metrics import Logs, iteration_times

if TYPE_CHECKING:  # tests.rig.testbed runs JobChurn
    from tests.rig.testbed import EmuJob

RECOVERED = 1.10  # within 10 % of the steady iteration time after the failure
STEADY_TAIL = 0.3  # the steady state: the last 30 % of the iterations after it
SMOOTH = 5  # iterations averaged when judging recovery


@dataclass(frozen=True)
class LinkDown:
    leaf: int
    spine: int
    at_s: float

    @staticmethod
    def parse(text: str) -> LinkDown:
        """'LEAF:SPINE@SECONDS', e.g. '0:0@15' (UsageError saying what is wrong)."""
        try:
            cable, at = text.split("@")
            leaf, spine = (int(x) for x in cable.split(":"))
            seconds = float(at)
        except ValueError:
            raise UsageError(f"--link-down: expected LEAF:SPINE@SECONDS (0:0@15), got "
                             f"{text!r}") from None
        if leaf < 0 or spine < 0 or not seconds >= 0:
            raise UsageError(f"--link-down: {text!r}: leaf, spine and time must be >= 0")
        return LinkDown(leaf, spine, seconds)

    def check(self, leaves: int, spines: int, duration_s: float) -> None:
        if self.leaf >= leaves or self.spine >= spines:
            raise UsageError(f"--link-down: the fabric has leaves 0..{leaves - 1} and spines "
                             f"0..{spines - 1}")
        if self.at_s >= duration_s:
            raise UsageError(f"--link-down: {self.at_s:g} s is not inside the "
                             f"{duration_s:g} s window")


def routes_of(doc: dict[str, Any]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """The leader's routes in a status document: (job, from, to, hops)."""
    return {(j["job_id"], r.get("src_host", ""), r.get("peer_host", ""),
             tuple(r.get("hops", ())))
            for j in (doc.get("cluster") or {}).get("jobs", []) for r in j.get("routes", [])}


def fail_link(f: Fabric, down: LinkDown, window_end: float,
              leader: Callable[[], dict[str, Any]] | None = None) -> dict[str, float | None]:
    """Sleep to the failure, take the cable down; with `leader`, wait (until
    `window_end`, epoch seconds) for the first plan whose routes changed. Times are
    epoch seconds; decided_s is from the failure to that plan (None: none came)."""
    time.sleep(down.at_s)
    before = routes_of(leader()) if leader is not None else set()
    t_down = time.time()
    f.set_link(down.leaf, down.spine, False)
    decided = None
    while leader is not None and time.time() < window_end:
        if routes_of(leader()) != before:
            decided = time.time() - t_down
            break
        time.sleep(0.25)
    return {"t_down": t_down, "decided_s": decided}


def recovery(ranks: Logs, t_down: float) -> dict[str, float | None]:
    """Rank 0's iteration time before the failure (median), its steady state after
    (median of the last STEADY_TAIL of iterations), and the seconds from the failure to
    the start of the first run of SMOOTH iterations whose mean stays within RECOVERED
    of that steady state through the end (None: too few iterations to tell)."""
    its = ranks[0] if ranks else []
    before = [it["end"] - it["t0"] for it in its if it["end"] <= t_down]
    after = [it for it in its if it["end"] > t_down]
    out: dict[str, float | None] = {
        "before_s": statistics.median(before) if before else None,
        "steady_s": None, "recovered_s": None}
    if len(after) < 2 * SMOOTH:
        return out
    times = [it["end"] - it["t0"] for it in after]
    steady = statistics.median(times[int(len(times) * (1 - STEADY_TAIL)):])
    out["steady_s"] = steady
    means = [statistics.fmean(times[i:i + SMOOTH]) for i in range(len(times) - SMOOTH + 1)]
    ok = [m <= RECOVERED * steady for m in means]
    first = next((i for i in range(len(ok)) if all(ok[i:])), None)
    if first is not None:
        out["recovered_s"] = max(0.0, after[first]["t0"] - t_down)
    return out


def without_cable(topo: Topology, a: str, b: str) -> Topology:
    """`topo` with the cable between switches a and b gone (both directions): the
    fabric after the failure, for the simulator's prediction of the degraded run."""
    t = TopologyBuilder(f"{topo.name} without {a}-{b}")
    for n in topo.nodes.values():
        if n.kind is NodeKind.HOST:
            t.host(n.id, n.gpus)
        else:
            t.switch(n.id, n.tier)
    for link in topo.links:
        if {link.src, link.dst} != {a, b}:
            t.link(link.src, link.dst, link.capacity_gbps, link.latency_us, both=False)
    return t.build()


def cluster_recovery(bins: list[tuple[float, float]], at_s: float,
                     tail: float = STEADY_TAIL, within: float = 0.05) -> float | None:
    """Seconds from the failure (`at_s` into the window) to the start of the first
    timeline bin after it from which every 3-bin mean stays within `within` of the
    utilisation the cluster settled at (median of the last `tail` of the bins after
    it); None if there are too few bins to tell."""
    after = [(t, u) for t, u in bins if t >= at_s]
    if len(after) < 6:
        return None
    us = [u for _, u in after]
    steady = statistics.median(us[int(len(us) * (1 - tail)):])
    means = [statistics.fmean(us[i:i + 3]) for i in range(len(us) - 2)]
    first = next((i for i in range(len(means))
                  if all(abs(m - steady) <= within * steady for m in means[i:])), None)
    return None if first is None else after[first][0] - at_s


@dataclass
class JobEvent:
    job: str
    kind: str  # "arrive" | "leave"
    at: float  # epoch seconds
    decided_s: float | None = None  # from the event to the leader's plan that took it in


class JobChurn:
    """Arrivals and departures during a run, in a thread (a context manager).

    The window opens `warmup_s` after every job present from the start has begun an
    iteration at or after `since` (epoch s), which is where the bench's window starts
    too (testbed_metrics.window_of). `start(job)` launches a job's ranks and `stop(job)`
    ends them; `decided(event, leader_status)` says whether the leader's plan has taken
    an event in (None: no leader, as under ECMP)."""

    def __init__(self, jobs: tuple[EmuJob, ...], logdir: Path, since: float, warmup_s: float,
                 start: Callable[[EmuJob], None], stop: Callable[[EmuJob], None],
                 leader: Callable[[], dict[str, Any]] | None = None,
                 decided: Callable[[JobEvent, dict[str, Any]], bool] | None = None) -> None:
        self.jobs = [j for j in jobs if j.churns]
        self.initial = [j for j in jobs if j.arrival_s <= 0]
        self.logdir, self.since, self.warmup_s = logdir, since, warmup_s
        self.start, self.stop = start, stop
        self.leader, self.decided = leader, decided
        self.events: list[JobEvent] = []
        self.opened: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> JobChurn:
        if self.jobs:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def _starts(self, job: EmuJob) -> list[float]:
        """Rank 0's iteration starts at or after `since`."""
        path = self.logdir / f"{job.id}.0.jsonl"
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for ln in lines:
            try:
                t0 = float(json.loads(ln)["t0"])
            except (ValueError, KeyError, TypeError):
                continue  # a line still being written
            if t0 >= self.since:
                out.append(t0)
        return out

    def _loop(self) -> None:
        started = {j.id for j in self.initial}
        stopped: set[str] = set()
        while not self._done.wait(0.1):
            now = time.time()
            if self.opened is None:
                firsts = [self._starts(j)[:1] for j in self.initial]
                if all(firsts):
                    self.opened = max(f[0] for f in firsts) + self.warmup_s
                continue
            for job in self.jobs:
                if job.id not in started and now >= self.opened + job.arrival_s:
                    started.add(job.id)
                    self.start(job)
                    self.events.append(JobEvent(job.id, "arrive", time.time()))
                elif (job.id in started and job.id not in stopped and job.iterations
                      and sum(t >= self.opened for t in self._starts(job)) >= job.iterations):
                    stopped.add(job.id)
                    self.stop(job)
                    self.events.append(JobEvent(job.id, "leave", time.time()))
            waiting = [e for e in self.events if e.decided_s is None]
            if waiting and self.leader is not None and self.decided is not None:
                try:
                    doc = self.leader()
                except Exception:  # a status that failed: ask again next round
                    continue
                for e in waiting:
                    if self.decided(e, doc):
                        e.decided_s = time.time() - e.at


def around(logs: dict[str, Logs], events: list[JobEvent], lo: float,
           hi: float) -> list[dict[str, Any]]:
    """Per event, each job's median iteration time (rank 0) before it (since the last
    event, or the window's start), from it until the leader's plan took it in, and
    after that plan (to the next event or the window's end): where a re-plan shows in
    the jobs' iterations. Without a leader the event takes effect at once."""
    out = []
    ordered = sorted(events, key=lambda e: e.at)
    times = [e.at for e in ordered]
    for k, e in enumerate(ordered):
        since = max(lo, times[k - 1] if k else lo)
        until = min(hi, times[k + 1] if k + 1 < len(times) else hi)
        effect = min(until, e.at + (e.decided_s or 0.0))
        jobs: dict[str, dict[str, float | None]] = {}
        for jid, ranks in logs.items():
            its = ranks[0] if ranks else []
            jobs[jid] = {"before_s": _median_in(its, since, e.at),
                         "until_plan_s": _median_in(its, e.at, effect),
                         "after_s": _median_in(its, effect, until)}
        out.append({"job": e.job, "event": e.kind, "at_s": e.at - lo,
                    "decided_s": e.decided_s, "jobs": jobs})
    return out


def _median_in(its: list[dict[str, float]], lo: float, hi: float) -> float | None:
    inside = iteration_times(its, lo, hi)
    return statistics.median(inside) if inside else None
