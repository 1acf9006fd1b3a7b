"""`cruxctl status` on a narrow terminal: the agents and jobs as a few lines each instead of
tables of 8 and 15 columns, which rich would squeeze to 2-3 characters a cell at 80 columns.
Same figures as the tables (cruxd/cli/status_view.py), every one labelled. The messages'
strings arrive made safe for rich (cruxd/cli/safe_text.scrub)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from cruxd.cli.status_cells import heard, num, routes, source_tag, state

NARROW = 120  # below this many columns the tables do not fit: print these instead


def agents(console: Console, rows: list[Any]) -> None:
    console.print("[bold]agents[/]")
    for a in rows:
        console.print(f" [bold]{a.host_id}[/]  {heard(a)}  v{a.version}  "
                      f"{a.gpus} GPUs  plan {a.applied_generation}")
        console.print(f"   {', '.join(a.addresses) or '-'}; measurement "
                      f"{a.measurement_source}; probing {a.probing_source}")


def jobs(console: Console, rows: list[Any], fabric: bool) -> None:
    console.print("[bold]jobs[/]")
    for j in rows:
        m = j.measurement
        qps = f"{j.qps_applied}/{j.qps_total}" if j.qps_total else "no shim report"
        t_j = num(m.comm_s) + (f" s ({source_tag(m.source)})" if m.source else "")
        console.print(f" [bold]{j.job_id}[/]  {state(j)}  level {j.level}  "
                      f"DSCP {j.dscp}  rank {j.rank}")
        console.print(f"   {','.join(j.hosts) or '-'} ({j.gpus} GPUs); I_j "
                      f"{num(j.intensity)}  k_j {num(j.k)}")
        console.print(f"   W_j {num(m.flops_per_iter)} FLOP  t_j {t_j}  period "
                      f"{num(m.period_s)} s")
        console.print(f"   QPs applied {qps}  changes {j.decision_changes}")
        for k, r in enumerate(routes(j, fabric).splitlines()):  # a route a line: they are long
            console.print(f"   {'paths' if k == 0 else '     '} {r}")
