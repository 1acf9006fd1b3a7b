"""bench/testbed.py's output: the tables it prints and the plot it draws, from the result
it builds (one dict per mode: the testbed's measurement and the simulator's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tables import table  # bench/ is on sys.path when run as a script

# what each replay of a run's paths gives the simulator, per mode (bench/testbed.py)
REPLAYED = {"crux": "the paths and levels the live plan ran",
            "crux-hints": "the paths and levels the live plan ran",
            "paths-only": "the paths the plan ran, every job on one level",
            "levels-only": "the paths the kernel's ECMP took, at the plan's levels"}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def print_tables(result: dict[str, Any]) -> None:
    rows = [[mode, f"{m['utilization']:.3f}", _pct(m["gain_over_ecmp"]),
             _num(m["fraction_of_standalone"]), f"{m['simulated']['utilization']:.3f}",
             _pct(m["simulated"]["error"])] for mode, m in result["modes"].items()]
    print(table(["mode", "GPU util", "vs ecmp", "of standalone", "simulated", "error"], rows))
    for mode, m in result["modes"].items():
        if "observed_paths" in m["simulated"]:
            o = m["simulated"]["observed_paths"]
            d = m["simulated"]["hash_draws"]
            print(f"{mode}, simulated on the paths the kernel's ECMP took: "
                  f"{o['utilization']:.3f} (error {_pct(o['error'])}); over {d['n']} hash "
                  f"seeds: {d['min']:.3f} to {d['max']:.3f}, mean {d['mean']:.3f}")
    for mode, m in result["modes"].items():
        if "as_planned" in m["simulated"]:
            o = m["simulated"]["as_planned"]
            print(f"{mode}, simulated on {REPLAYED[mode]}: "
                  f"{o['utilization']:.3f} (error {_pct(o['error'])})"
                  + (f"; the same paths on one level: {one['utilization']:.3f}"
                     if (one := m["simulated"].get("one_level")) else ""))
    for mode, m in result["modes"].items():
        if meas := m.get("measured"):
            print(f"{mode}, measured live (t_j / period, against each job alone): " + "; ".join(
                f"{j} {x['comm_s']:.3f} s ({x['comm_error']:+.1%}) / {x['period_s']:.3f} s "
                f"({x['period_error']:+.1%}) [{x['source']}]" for j, x in meas.items()))
    for mode, m in result["modes"].items():
        if c := m.get("control"):
            print(f"{mode}, in the measured window: {c['replans_total']} re-plan(s) ("
                  + (", ".join(f"{k} {n}" for k, n in sorted(c["replans"].items())) or "none")
                  + f"), {c['unchanged']} plan(s) that changed no decision; decision changes "
                  + ", ".join(f"{j} {n}" for j, n in sorted(c["decision_changes"].items()))
                  + "; ring rebuilds " + ", ".join(
                      f"{j} {n}" for j, n in sorted(c["ring_rebuilds"].items()))
                  + f"; rebuilds without a decision change: {c['rebuilds_without_change']}")
    for mode, m in result["modes"].items():
        if "link_down" in m:
            d = m["link_down"]
            print(f"{mode}: cable leaf {d['leaf']} - spine {d['spine']} down "
                  f"{d['at_s']:.1f} s into the window; new decisions after "
                  f"{_secs(d['decided_s'])}, utilisation settled after "
                  f"{_secs(d['recovered_s'])} (every job's iterations: after "
                  f"{_secs(d['jobs_recovered_s'])}); utilisation "
                  f"{d['utilization_before']:.3f} before, {d['utilization_after']:.3f} "
                  f"after, simulated on the fabric without the cable "
                  f"{d['simulated_after']:.3f} (crux-full's own plan)"
                  + (f", {d['simulated_as_planned_after']:.3f} (the plan that ran after)"
                     if "simulated_as_planned_after" in d else "")
                  + "; levels at the end: " + ", ".join(
                      f"{j} {lv}" for j, lv in d.get("levels_after", {}).items()))
    for mode, m in result["modes"].items():
        if m.get("events"):
            jobs = list(m["jobs"])
            print(f"\n{mode}: jobs arriving and leaving (median iteration s: before the "
                  f"event / until the plan that took it in / after that plan)")
            print(table(["event", "at s", "plan after", *jobs],
                        [[f"{e['job']} {e['event']}s", f"{e['at_s']:.1f}",
                          _secs(e["decided_s"]) if mode != "ecmp" else "(no leader)",
                          *(_phase(e["jobs"][j]) for j in jobs)] for e in m["events"]]))
    for mode, m in result["modes"].items():
        print(f"\n{mode}")
        print(table(["job", "GPUs", "iteration s", "iterations", "utilisation"],
                    [[j, s["gpus"], f"{s['iteration_s']:.3f}", s["iterations"],
                      f"{s['utilization']:.3f}"] for j, s in m["jobs"].items()]))


def plot(path: Path, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for mode, m in result["modes"].items():
        if "timeline" in m:
            xs, ys = zip(*m["timeline"], strict=True) if m["timeline"] else ((), ())
            line = ax.plot(xs, ys, label=f"{mode} ({m['utilization']:.3f})")
            if "link_down" in m:
                ax.axvline(m["link_down"]["at_s"], color="grey", linestyle=":")
            for e in m.get("events", []):  # arrivals and departures, as they happened
                ax.axvline(e["at_s"], color=line[0].get_color(), linestyle=":", alpha=0.6)
                ax.annotate(f"{e['job']} {e['event']}s", (e["at_s"], 0.02), rotation=90,
                            fontsize=7, color=line[0].get_color())
        elif mode == "standalone":
            ax.axhline(m["utilization"], color="black", linestyle="--",
                       label=f"standalone ({m['utilization']:.3f})")
    ax.set_xlabel("seconds into the measured window")
    ax.set_ylabel("cluster GPU utilisation")
    ax.set_ylim(0, 1.05)
    ax.set_title(Path(result["scenario"]).name)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _secs(x: float | None) -> str:
    return "- (not within the window)" if x is None else f"{x:.1f} s"


def _phase(p: dict[str, float | None]) -> str:
    return " / ".join("-" if p[k] is None else f"{p[k]:.3f}"
                      for k in ("before_s", "until_plan_s", "after_s"))


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
