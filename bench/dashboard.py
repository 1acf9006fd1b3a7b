"""Render examples/grafana/crux-dashboard.json from a live run, through a real Prometheus.

No Grafana can be installed here, so this draws the dashboard's own panels (its grid, its
queries, its legends) with matplotlib from what a real Prometheus scraped of real daemons:

  * one leader and four agents (`cruxd`, separate processes on loopback, a 2x2 clos2
    topology), the leader declaring three lossless priorities ([leader]
    lossless_priorities = [2, 3, 4]: three levels on DSCP 18, 26, 34), profiling_s 5;
  * Prometheus 2.42 (Debian's) scraping the five /metrics every second;
  * jobs registered by `crux-run` over the run: "big" on h0+h1, "small" on h2+h3, "mid" on
    h1+h2, then "small" ends;
  * each panel's queries as Grafana sends them ($job: all jobs; $__rate_interval: 15 s),
    through Prometheus' query_range API, one point a second.

    .venv/bin/python bench/dashboard.py [--seconds 75] [--out docs/images/dashboard.png]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tables import preamble, table  # bench/ is on sys.path when run as a script

from cruxd.testing import Daemon, crux_run, free_port, wait_for

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "examples" / "grafana" / "crux-dashboard.json"
JOBS = {  # name: (hosts, crux-run measurement flags)
    "big": (("h0", "h1"), ("--flops-per-iter", "4e15", "--compute-s", "0.5",
                           "--allreduce-bytes", "1e9")),
    "small": (("h2", "h3"), ("--flops-per-iter", "1e14", "--compute-s", "0.5",
                             "--allreduce-bytes", "1e9")),
    "mid": (("h1", "h2"), ("--flops-per-iter", "1e15", "--compute-s", "0.5",
                           "--allreduce-bytes", "2e9")),
}


def metrics_port(d: Daemon) -> int:
    m = re.search(r"metrics on http://127\.0\.0\.1:(\d+)", d.wait_log("metrics on http://"))
    assert m, d.log_text()[-2000:]
    return int(m.group(1))


def query_range(prom: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 1})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{q}", timeout=30) as r:
        doc = json.load(r)
    if doc.get("status") != "success":
        raise RuntimeError(f"{expr}: {doc}")
    out: list[dict[str, Any]] = doc["data"]["result"]
    return out


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def run(args: argparse.Namespace, tmp: Path) -> tuple[list[tuple[dict[str, Any], list[Any]]],
                                                     float, float]:
    topo = tmp / "fabric.json"
    topo.write_text(json.dumps({"builder": "clos2", "tors": 2, "aggs": 2, "hosts_per_tor": 2,
                                "nics_per_host": 1}))
    port = free_port()
    leader = Daemon(tmp, "leader", {
        "daemon": {"roles": ["leader"], "log_level": "info"},
        "leader": {"listen": f"127.0.0.1:{port}", "topology": str(topo), "profiling_s": 5,
                   "debounce_ms": 20, "lossless_priorities": [2, 3, 4]},
        "metrics": {"listen": "127.0.0.1:0"}})
    agents = {h: Daemon(tmp, h, {
        "daemon": {"roles": ["agent"], "log_level": "info"},
        "agent": {"leader": f"127.0.0.1:{port}", "addresses": [f"10.0.0.{i + 1}"], "gpus": 8,
                  "leader_token": str(leader.root / "state" / "leader.token"),
                  "report_interval_s": 0.5, "reconnect_max_s": 1.0},
        "metrics": {"listen": "127.0.0.1:0"}}) for i, h in enumerate(("h0", "h1", "h2", "h3"))}
    jobs: dict[str, list[subprocess.Popen[bytes]]] = {}
    prom_proc = None
    try:
        leader.start().wait_log("leader listening")
        for a in agents.values():
            a.start()
        targets = [f"127.0.0.1:{metrics_port(d)}" for d in (leader, *agents.values())]
        prom_port = free_port()
        (tmp / "prometheus.yml").write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "crux", "static_configs": [{"targets": targets}]}]}))
        prom_proc = subprocess.Popen(
            [args.prometheus, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}",
             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        prom = f"http://127.0.0.1:{prom_port}"
        wait_for("Prometheus ready", lambda: _ready(prom), 60)
        start = time.time()
        print(f"    ... leader and 4 agents up; Prometheus scraping {len(targets)} targets",
              file=sys.stderr, flush=True)
        plan = [(0.1, "start", "big"), (0.25, "start", "small"), (0.45, "start", "mid"),
                (0.7, "stop", "small")]
        for frac, what, name in plan:
            time.sleep(max(0.0, start + frac * args.seconds - time.time()))
            hosts, flags = JOBS[name]
            if what == "start":
                jobs[name] = [crux_run(agents[h].socket, name, "--gpus", "8", "--nnodes",
                                       str(len(hosts)), "--node-rank", str(r), *flags)
                              for r, h in enumerate(hosts)]
            else:
                for p in jobs.pop(name):
                    p.terminate()
                    p.wait()
            print(f"    ... {time.time() - start:5.1f} s: {what} {name}", file=sys.stderr,
                  flush=True)
        time.sleep(max(0.0, start + args.seconds - time.time()))
        end = time.time()
        doc = json.loads(DASHBOARD.read_text())
        out = []
        for p in doc["panels"]:
            series = []
            for t in p.get("targets", ()):
                expr = t["expr"].replace("$__rate_interval", "15s").replace("$job", ".*")
                for s in query_range(prom, expr, start, end):
                    series.append((legend(t.get("legendFormat", ""), s["metric"]) or expr,
                                   [(float(x) - start, float(v)) for x, v in s["values"]]))
            out.append((p, series))
        return out, start, end
    finally:
        for procs in jobs.values():
            for p in procs:
                p.kill()
                p.wait()
        if prom_proc is not None:
            prom_proc.terminate()
            prom_proc.wait(30)
        for d in (*agents.values(), leader):
            d.stop()


def _ready(prom: str) -> bool:
    try:
        with urllib.request.urlopen(f"{prom}/-/ready", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def render(panels: list[tuple[dict[str, Any], list[Any]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p, _ in panels)
    unit = 0.55  # inches per grid row
    fig = plt.figure(figsize=(20, rows * unit))
    for p, series in panels:
        g = p["gridPos"]
        # room on the left for the tick labels, above for the title
        box = [g["x"] / 24 + 0.03, 1 - (g["y"] + g["h"]) / rows + 0.014,
               g["w"] / 24 - 0.038, g["h"] / rows - 0.034]
        if p["type"] == "row":
            fig.text(0.005, 1 - (g["y"] + 0.7) / rows, p["title"], fontsize=13,
                     fontweight="bold")
            continue
        ax = fig.add_axes(box)
        ax.set_title(p["title"], fontsize=9, loc="left")
        ax.tick_params(labelsize=7)
        if p["type"] == "stat":
            ax.set_axis_off()
            text = "  ".join(f"{name}: {_fmt(pts[-1][1])}" for name, pts in series if pts)
            ax.text(0.5, 0.4, text or "no data", ha="center", va="center", fontsize=14 if
                    len(series) < 3 else 9, transform=ax.transAxes, wrap=True)
            continue
        for name, pts in series:
            ax.plot([x for x, _ in pts], [y for _, y in pts], label=name[:40], lw=1.2)
        if series:
            ax.legend(fontsize=6, loc="upper left", ncol=2, frameon=False)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("s", fontsize=7)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    return f"{v:.0f}" if v == int(v) else f"{v:.3g}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=75.0)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "dashboard.png")
    ap.add_argument("--prometheus", default=shutil.which("prometheus") or "prometheus")
    args = ap.parse_args()
    preamble()
    with tempfile.TemporaryDirectory(prefix="crux-dashboard-") as tmp:
        panels, start, end = run(args, Path(tmp))
    render(panels, args.out)
    print(f"dashboard: {DASHBOARD.relative_to(ROOT)}, {len(panels)} panels, {end - start:.0f} s "
          f"of a live run; PNG: {args.out}")
    print(table(["panel", "type", "series", "latest values"], [
        [p["title"], p["type"], len(series),
         ", ".join(f"{n}={_fmt(pts[-1][1])}" for n, pts in series[:4] if pts)[:70]]
        for p, series in panels if p["type"] != "row"]))
    print(f"\n    .venv/bin/python bench/dashboard.py --seconds {args.seconds:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
