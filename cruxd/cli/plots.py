"""`cruxctl simulate --plot`: one figure, two panels (matplotlib, Agg, imported lazily;
an optional dependency: `pip install 'crux[plot]'`).

Top: GPU utilisation over time, one line per policy. Bottom: each job's slowdown,
a bar per policy side by side, in the same colours.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cruxd.errors import UsageError
from cruxd.extras import require

if TYPE_CHECKING:
    from cruxd.cli.simulate_cmd import Run
    from cruxd.scenario import Scenario

_DASHES = ("-", (0, (6, 2)), (0, (3, 2)), (0, (6, 2, 1, 2)), (0, (1, 1.5)))
MAX_JOBS = 24  # bars beyond this are unreadable: show the most slowed-down jobs
STARVED = 1e6  # slowdowns beyond this: the job made (next to) no progress


def need_matplotlib() -> None:
    """Raise, in one line, unless matplotlib can be imported (it is an optional extra)."""
    require("matplotlib", "--plot")


def write_plot(path: Path, sc: Scenario, runs: list[Run]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import TABLEAU_COLORS
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    colours = list(TABLEAU_COLORS.values())  # tab10, as hex strings
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8.5), height_ratios=(1, 1.1),
                                      layout="constrained")
    horizon = max((r.result.horizon_s for r in runs), default=0.0)
    used = sum(j.gpus for j in sc.view.jobs)
    fig.suptitle(f"{sc.name}: {len(sc.view.jobs)} jobs on {used} GPUs, {horizon:g} s simulated",
                 fontsize=14, fontweight="bold")

    low = 100.0
    for i, run in enumerate(runs):
        t, u = run.result.utilization_over_time()
        mean = run.result.gpu_utilization
        label = f"{run.name}  ({mean:.1%})" if math.isfinite(mean) else run.name
        # equal lines stay visible: earlier ones wider, later ones dashed on top
        top.plot(t, u * 100, drawstyle="steps-mid", color=colours[i % 10], label=label,
                 lw=2.0 + 2.5 * (len(runs) - 1 - i) / max(1, len(runs) - 1),
                 ls=_DASHES[i % len(_DASHES)], zorder=2 + i)
        if len(u) and np.isfinite(u).any():
            low = min(low, float(np.nanmin(u)) * 100)
    top.set_title("GPU utilisation over time (busy / allocated GPU-seconds, averaged "
                  "between arrivals and departures)", loc="left", fontsize=12)
    top.set_xlabel("simulated time (s)")
    top.set_ylabel("GPU utilisation (%)")
    top.set_ylim(max(0.0, 10 * math.floor((low - 5) / 10)), 104)
    if horizon > 0:
        top.set_xlim(0, horizon)
    top.grid(alpha=0.3)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=10, frameon=False,
               title="policy (mean)", title_fontsize=10, alignment="left")
    _arrivals(top, sc, horizon)

    ids = _jobs_shown(sc, runs)
    width = 0.8 / max(1, len(runs))
    table = [[_slowdown(run, j) for j in ids] for run in runs]
    peak = max([1.0, *(y for ys in table for y in ys if math.isfinite(y) and y < STARVED)])
    top_y = peak * 1.18
    for i, ys in enumerate(table):
        xs = [k + (i - (len(runs) - 1) / 2) * width for k in range(len(ids))]
        shown = [y if math.isnan(y) else min(y, top_y * 0.94) for y in ys]  # starved: cut
        bars = bottom.bar(xs, shown, width * 0.92, color=colours[i % 10])
        for bar, y in zip(bars, ys, strict=True):
            if y >= STARVED:  # cut at the top of the axes; hatched so it reads as "more"
                bar.set_hatch("//")
                bar.set_edgecolor("white")
        if len(ids) * len(runs) <= 40:
            bottom.bar_label(bars, [_label(y, len(runs)) for y in ys], fontsize=8, padding=2)
    bottom.axhline(1.0, color="black", lw=1, ls="--")
    gpus = {j.id: j.gpus for j in sc.view.jobs}
    bottom.set_xticks(range(len(ids)), [f"{j}\n{gpus[j]} GPUs" for j in ids],
                      rotation=0 if len(ids) <= 8 else 45,
                      ha="center" if len(ids) <= 8 else "right", fontsize=10)
    bottom.set_ylim(0, top_y)
    bottom.set_ylabel("slowdown (× standalone iteration time)")
    cut = f" ({MAX_JOBS} most slowed down of {len(sc.view.jobs)})" if len(ids) < len(
        sc.view.jobs) else ""
    bottom.set_title(f"Per-job slowdown by policy{cut}", loc="left", fontsize=12)
    bottom.grid(axis="y", alpha=0.3)
    standalone = Line2D([], [], color="black", lw=1, ls="--", label="standalone (1.0)")
    handles = [standalone, *(Patch(color=colours[i % 10], label=run.name)
                             for i, run in enumerate(runs))]  # not a (hatched) bar
    bottom.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=10,
                  frameon=False)
    try:
        fig.savefig(path, dpi=120)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--plot {path}: cannot write: {exc}") from None
    finally:
        plt.close(fig)


def _jobs_shown(sc: Scenario, runs: list[Run]) -> list[str]:
    ids = [j.id for j in sc.view.jobs]
    if len(ids) <= MAX_JOBS:
        return ids
    worst: dict[str, float] = {}
    for run in runs:
        for r in run.result.jobs:
            if r.throughput_ratio > 0:
                worst[r.job] = max(worst.get(r.job, 0.0), 1.0 / r.throughput_ratio)
    keep = set(sorted(worst, key=lambda j: -worst[j])[:MAX_JOBS])
    return [j for j in ids if j in keep]


def _arrivals(ax: Any, sc: Scenario, horizon: float) -> None:
    """Dotted lines where jobs arrive during the run, labelled when there are few."""
    at: dict[float, list[str]] = {}
    for job, timing in zip(sc.view.jobs, sc.simulation.timing, strict=True):
        if 0 < timing.arrival_s < horizon:
            at.setdefault(timing.arrival_s, []).append(job.id)
    for t, ids in at.items():
        ax.axvline(t, color="grey", lw=0.8, ls=":", zorder=1)
        if len(at) <= 12:
            name = ids[0] if len(ids) == 1 else f"{len(ids)} jobs"
            ax.annotate(f"+{name}", (t, 1.0), xycoords=("data", "axes fraction"),
                        xytext=(3, -3), textcoords="offset points", va="top", fontsize=8,
                        color="dimgrey")


def _slowdown(run: Run, job: str) -> float:
    """Standalone over achieved iteration rate; inf: starved; nan: never ran."""
    rec = next((r for r in run.result.jobs if r.job == job), None)
    if rec is None or not math.isfinite(rec.throughput_ratio):
        return math.nan
    return 1.0 / rec.throughput_ratio if rec.throughput_ratio > 0 else math.inf


def _label(y: float, policies: int) -> str:
    if not math.isfinite(y) and not math.isinf(y):
        return "n/a"
    if y >= STARVED:
        return "starved"
    if policies >= 4 and abs(y - 1.0) < 0.005:
        return ""  # the dashed standalone line says it; labels would collide
    return f"{y:.2f}"
