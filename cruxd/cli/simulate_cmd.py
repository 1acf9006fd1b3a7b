"""`cruxctl simulate`: run the policies, show a progress bar, print tables or JSON."""

from __future__ import annotations

import math
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from cruxd.cli.common import console as _console
from cruxd.cli.plan_view import topology_summary
from cruxd.scenario import Scenario
from cruxd.scenario.simulation import SimSettings
from cruxd.sim.metrics import JobRecord, SimResult
from cruxd.sim.run import SimJob, simulate

PROGRESS_AFTER_S = 1.0  # runs quicker than this never show a bar
STARVED = 1e6  # a slowdown beyond this: the job made (next to) no progress


@dataclass
class Run:
    name: str  # the policy as asked for
    result: SimResult
    wall_s: float


class DelayedProgress:
    """A transient progress bar on stderr that appears only once the work has taken
    longer than `after` seconds, and only on a terminal."""

    def __init__(self, total_s: float, after: float = PROGRESS_AFTER_S,
                 enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.total = total_s if math.isfinite(total_s) else None
        self.after = after
        self._lock = threading.Lock()
        self._shown = self._closed = False
        self._timer: threading.Timer | None = None
        self.bar = Progress(TextColumn("[bold]{task.description:>14}"), BarColumn(),
                            TextColumn("{task.fields[at]}"), TimeElapsedColumn(),
                            console=_console(stderr=True), transient=True, auto_refresh=True)

    def __enter__(self) -> DelayedProgress:
        if self.enabled:
            self._timer = threading.Timer(self.after, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def _show(self) -> None:
        with self._lock:
            if not self._closed:
                self.bar.start()
                self._shown = True

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self._shown:
                self.bar.stop()

    def task(self, name: str, start_s: float) -> TaskID:
        task = self.bar.add_task(name, total=self.total, at=self._at(start_s))
        self.bar.update(task, completed=start_s)  # add_task's stub says int; it is seconds
        return task

    def advance(self, task: TaskID, now_s: float) -> None:
        self.bar.update(task, completed=now_s, at=self._at(now_s))

    def _at(self, now_s: float) -> str:
        if self.total is None:
            return f"{now_s:,.0f} s simulated"
        return f"{min(now_s, self.total):,.0f} / {self.total:,.0f} s"


def run_policies(sc: Scenario, jobs: list[SimJob], settings: SimSettings) -> list[Run]:
    topo = sc.view.topology
    start = min((j.arrival_s for j in jobs), default=0.0)
    runs: list[Run] = []
    with DelayedProgress(settings.config.horizon_s) as bar:
        for name, policy in settings.runs:
            task = bar.task(name, start)
            t0 = time.perf_counter()
            result = simulate(jobs, topo, policy, settings.config,
                              progress=partial(bar.advance, task))
            runs.append(Run(name, result, time.perf_counter() - t0))
            bar.advance(task, bar.total if bar.total is not None else result.horizon_s)
    return runs


# --- JSON -------------------------------------------------------------------------

def _num(x: float) -> float | None:
    return round(x, 6) if math.isfinite(x) else None


def job_json(r: JobRecord) -> dict[str, Any]:
    ratio = r.throughput_ratio
    slowdown = 1.0 / ratio if math.isfinite(ratio) and ratio > 0 else math.nan
    return {"job": r.job, "gpus": r.gpus, "arrival_s": _num(r.arrival_s),
            "end_s": _num(r.end_s), "throughput_ratio": _num(ratio), "slowdown": _num(slowdown),
            "jct_s": _num(r.jct_s), "standalone_jct_s": _num(r.standalone_jct_s),
            "busy_gpu_s": _num(r.busy_gpu_s), "iterations": _num(r.iterations),
            "finished": r.iterations_goal is not None
            and r.iterations >= r.iterations_goal - 1e-6}


def simulate_json(sc: Scenario, settings: SimSettings, runs: list[Run]) -> dict[str, Any]:
    cfg = settings.config
    order = {j.id: i for i, j in enumerate(sc.view.jobs)}
    return {
        "version": 1, "scenario": sc.name, "source": sc.source,
        "topology": topology_summary(sc.view.topology),
        "horizon_s": _num(cfg.horizon_s), "levels": cfg.levels, "seed": cfg.seed,
        "results": [{**run.result.summary(), "policy": run.name,
                     "per_job": [job_json(r) for r in
                                 sorted(run.result.jobs, key=lambda r: order[r.job])]}
                    for run in runs]}


# --- tables -----------------------------------------------------------------------

def _f(x: float, fmt: str = ".3f") -> str:
    return format(x, fmt) if math.isfinite(x) else "-"


def _slow(x: float, fmt: str = ".3f") -> str:
    """A slowdown; a job that made no progress has an infinite one."""
    return "∞ (starved)" if x >= STARVED else _f(x, fmt)


def print_simulation(console: Console, sc: Scenario, settings: SimSettings,
                     runs: list[Run]) -> None:
    cfg = settings.config
    t = topology_summary(sc.view.topology)
    horizon = f"{cfg.horizon_s:g} s" if math.isfinite(cfg.horizon_s) else "until every job ends"
    used = sum(j.gpus for j in sc.view.jobs)
    console.print(f"[bold]{sc.name}[/]: {len(sc.view.jobs)} jobs on {used} of {t['gpus']} GPUs "
                  f"({t['name']}); simulated {horizon}, {cfg.levels} priority levels, "
                  f"seed {cfg.seed}")
    if sc.description:
        console.print(sc.description, style="dim")

    base = runs[0].result.gpu_utilization if runs else math.nan
    summary = Table(title="GPU utilisation and slowdown per policy", title_justify="left",
                    caption="utilisation: busy over allocated GPU-seconds; slowdown: standalone "
                            "over achieved iteration rate (1 = as if alone); worst ratio: the "
                            "slowest job's achieved/standalone rate; network: fabric links' "
                            "carried bytes over capacity", caption_justify="left")
    summary.add_column("policy", no_wrap=True)
    for col in ("GPU util", f"vs {runs[0].name}" if runs else "vs", "mean slowdown",
                "max slowdown", "worst ratio", "network util", "run s"):
        summary.add_column(col, justify="right", no_wrap=True)
    best = max((r.result.gpu_utilization for r in runs
                if math.isfinite(r.result.gpu_utilization)), default=math.nan)
    for run in runs:
        res = run.result
        util = res.gpu_utilization
        delta = f"{(util / base - 1):+.1%}" if base > 0 and math.isfinite(util) else "-"
        style = "bold green" if len(runs) > 1 and util == best else None
        summary.add_row(run.name, _f(util), delta, _slow(res.mean_slowdown),
                        _slow(res.max_slowdown), _f(res.worst_throughput_ratio),
                        _f(res.network_utilization), f"{run.wall_s:.2f}", style=style)
    console.print(summary)

    jobs = Table(title="Slowdown per job (standalone / achieved iteration rate)",
                 title_justify="left")
    for col in ("job", "GPUs", "arrives s", "iterations"):
        jobs.add_column(col, justify="left" if col == "job" else "right", no_wrap=True)
    for run in runs:
        jobs.add_column(run.name, justify="right", no_wrap=True)
    records = [{r.job: r for r in run.result.jobs} for run in runs]
    missing = 0
    for sj, timing in zip(sc.view.jobs, sc.simulation.timing, strict=True):
        cells = []
        for rec in records:
            r = rec.get(sj.id)
            ratio = r.throughput_ratio if r is not None else math.nan
            cells.append(_slow(1.0 / ratio if ratio > 0 else math.inf, ".2f")
                         if math.isfinite(ratio) else "-")
        missing += all(sj.id not in rec for rec in records)
        goal = f"{timing.iterations:g}" if timing.iterations is not None else "-"
        jobs.add_row(sj.id, str(sj.gpus), f"{timing.arrival_s:g}", goal, *cells)
    console.print(jobs)
    if missing:
        console.print(f"{missing} job(s) arrive after the horizon and never ran (-).",
                      style="dim")
