"""The simulation part of a scenario (docs/scenario.md, "Simulation").

Per job: `arrival_s`, `iterations`, `start_phase`; top level: the `simulate` object.
`parse_simulation` checks the structure when the file is read (so `cruxctl plan`
sees a bad field too, and ignores good ones); `simulation_of` turns a scenario and
the command line's overrides into simulator jobs and settings. Policy names are
checked there, not at load time, so a scenario naming a policy this crux lacks
still plans.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from cruxd.errors import ScenarioError, UsageError
from cruxd.model.jobs import Job
from cruxd.scenario.cursor import Cursor
from cruxd.sim.run import SimConfig, SimJob

if TYPE_CHECKING:
    from cruxd.model.view import ClusterView
    from cruxd.scheduler.planner import PlanConfig
    from cruxd.sim.policies import Policy

PHASES = ("compute", "comm")
FIXED = "fixed"
DEFAULT_POLICIES = ("ecmp", "crux-full")
DEFAULT_LEVELS = 8  # the seed's simulator (§6.1)
JOB_FIELDS = frozenset({"arrival_s", "iterations", "start_phase"})
_SIMULATE = {"horizon_s", "policies", "levels", "window_s", "replan_every_s", "fixed_levels"}


class Scenario(Protocol):
    """What simulating needs of a loaded scenario (load.Scenario), so that this module and
    the loader, which parses the simulate section with it, do not import each other."""

    @property
    def source(self) -> str: ...

    @property
    def view(self) -> ClusterView: ...

    @property
    def config(self) -> PlanConfig: ...

    @property
    def simulation(self) -> SimulationSpec: ...


@dataclass(frozen=True)
class JobTiming:
    arrival_s: float = 0.0
    iterations: float | None = None  # None: runs to the horizon
    start_phase: str = "compute"


@dataclass(frozen=True)
class SimulationSpec:
    """What a scenario file says about simulating it, checked for structure."""

    timing: tuple[JobTiming, ...] = ()  # per job, in file order
    horizon_s: float | None = None
    policies: tuple[str, ...] = ()  # as written; checked against the registry later
    levels: int = DEFAULT_LEVELS
    window_s: float | None = None
    replan_every_s: float | None = None
    fixed_levels: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class SimSettings:
    """One simulation request: the runs to do (policy name, fresh policy) and the config."""

    runs: tuple[tuple[str, Policy], ...]
    config: SimConfig


def parse_simulation(cur: Cursor, jobs: Sequence[Job]) -> SimulationSpec:
    """Read the per-job timing fields and `simulate` from a scenario's top-level cursor
    (the jobs are already parsed, in file order)."""
    timing = tuple(_timing(jc) for jc in cur["jobs"].items())
    sc = cur.get("simulate")
    if sc is None:
        return SimulationSpec(timing=timing)
    sc.fields(set(), _SIMULATE)
    horizon, window, replan = (sc[k].number(positive=True) if sc.get(k) is not None else None
                               for k in ("horizon_s", "window_s", "replan_every_s"))
    levels = sc["levels"].integer(lo=1, hi=64) if sc.get("levels") is not None else DEFAULT_LEVELS
    policies: list[str] = []
    if sc.get("policies") is not None:
        for pc in sc["policies"].items():
            name = pc.string()
            if name in policies:
                raise pc.fail(f"policy {name!r} listed twice")
            policies.append(name)
        if not policies:
            raise sc["policies"].fail("give at least one policy (or leave the field out)")
    fixed: dict[str, int] = {}
    if sc.get("fixed_levels") is not None:
        ids = {j.id for j in jobs}
        for key, lc in sc["fixed_levels"].entries():
            if key not in ids:
                raise lc.fail(f"no job has id {key!r} (jobs: {', '.join(sorted(ids))})")
            fixed[key] = lc.integer(lo=0, hi=levels - 1)
    if FIXED in policies and sc.get("fixed_levels") is None:
        raise sc.fail("missing field 'fixed_levels' (job id -> level), which policy "
                      "'fixed' needs")
    return SimulationSpec(timing, horizon, tuple(policies), levels, window, replan,
                          MappingProxyType(fixed))


def _timing(jc: Cursor) -> JobTiming:
    arrival = jc["arrival_s"].number(lo=0.0) if jc.get("arrival_s") is not None else 0.0
    iterations = (jc["iterations"].number(positive=True) if jc.get("iterations") is not None
                  else None)
    phase = "compute"
    if jc.get("start_phase") is not None:
        phase = jc["start_phase"].string()
        if phase not in PHASES:
            raise jc["start_phase"].fail(f"expected \"compute\" or \"comm\", got {phase!r}")
    return JobTiming(arrival, iterations, phase)


def simulation_of(sc: Scenario, *, policies: Sequence[str] | None = None,
                  horizon_s: float | None = None, seed: int | None = None,
                  levels: int | None = None) -> tuple[list[SimJob], SimSettings]:
    """Simulator jobs and settings for a scenario; keyword arguments are the command
    line's overrides (UsageError naming the flag when one is bad; ScenarioError with the
    file and JSON path when the file's own value cannot be used)."""
    spec = sc.simulation
    jobs = sc.view.jobs
    sim_jobs = [SimJob(j, t.arrival_s, t.iterations, t.start_phase)
                for j, t in zip(jobs, spec.timing, strict=True)]
    horizon = _horizon(sc, horizon_s)
    if levels is not None:
        if not 1 <= levels <= 64:
            raise UsageError(f"--levels must be 1..64, got {levels}")
        over = {j: lv for j, lv in spec.fixed_levels.items() if lv >= levels}
        if over:
            job, lv = next(iter(over.items()))
            raise UsageError(f"--levels {levels}: simulate.fixed_levels puts {job!r} on level "
                             f"{lv} (levels are 0..{levels - 1})")
    if seed is not None and seed < 0:
        raise UsageError(f"--seed must be >= 0, got {seed}")
    kw: dict[str, float] = {}
    if spec.window_s is not None:
        kw["window_s"] = spec.window_s
    config = SimConfig(horizon_s=horizon, levels=levels if levels is not None else spec.levels,
                       seed=seed if seed is not None else sc.config.seed,
                       replan_every_s=spec.replan_every_s, max_paths=sc.config.max_paths, **kw)
    return sim_jobs, SimSettings(_policies(sc, policies), config)


def _horizon(sc: Scenario, override: float | None) -> float:
    if override is not None:
        if not (math.isfinite(override) and override > 0):
            raise UsageError(f"--horizon must be a positive number of seconds, got {override}")
        return override
    if sc.simulation.horizon_s is not None:
        return sc.simulation.horizon_s
    open_ended = [i for i, t in enumerate(sc.simulation.timing) if t.iterations is None]
    if open_ended:
        i = open_ended[0]
        raise ScenarioError(
            f"missing: job {sc.view.jobs[i].id!r} ($.jobs[{i}]) has no 'iterations', so the "
            "run needs a horizon (give simulate.horizon_s, or --horizon SECONDS)",
            where=sc.source, path="$.simulate.horizon_s")
    return math.inf


def _policies(sc: Scenario, names: Sequence[str] | None) -> tuple[tuple[str, Policy], ...]:
    from cruxd.sim.policies import Fixed, make_policy

    spec = sc.simulation
    from_file = names is None and bool(spec.policies)
    if names is None:
        names = spec.policies or DEFAULT_POLICIES
    seen: set[str] = set()
    runs: list[tuple[str, Policy]] = []
    for i, name in enumerate(names):
        where = f"$.simulate.policies[{i}]"
        if name in seen:
            raise UsageError(f"--policy: {name!r} given twice")
        seen.add(name)
        if name == FIXED:
            if not spec.fixed_levels and not from_file:
                raise UsageError("--policy fixed: the scenario has no simulate.fixed_levels "
                                 "(job id -> level) to fix")
            runs.append((name, Fixed(spec.fixed_levels)))
            continue
        try:
            runs.append((name, make_policy(name)))
        except ValueError as exc:
            if from_file:
                raise ScenarioError(str(exc), where=sc.source, path=where) from None
            raise UsageError(f"--policy: {exc}") from None
    return tuple(runs)
