"""`cruxctl status JOB`: why one job has the decision it has (pure: status and plan in, text out).

From the leader's status (the job's state, level, DSCP, routes, what the shims applied) and
its plan document (every job's I_j, k_j and priority, and which jobs share each link):
  - its level and why: profiled alone at the top, unmeasured at the bottom, or its priority
    P_j = k_j x I_j ranked among the jobs it contends with;
  - the jobs it yields to and the jobs that yield to it, on which links, with their I_j;
  - its paths and ports, and what the job-side libraries applied.
"""

from __future__ import annotations

import math
from typing import Any


def _num(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isinf(x)):
        return "∞"
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def explain(job_id: str, cluster: dict[str, Any], plan: dict[str, Any] | None) -> dict[str, Any]:
    """The explanation as data (`--json`); `lines` renders it. KeyError if no such job."""
    jobs = {j["job_id"]: j for j in cluster.get("jobs", [])}
    if job_id not in jobs:
        raise KeyError(job_id)
    j = jobs[job_id]
    m = j.get("measurement") or {}
    out: dict[str, Any] = {
        "job_id": job_id, "state": j["state"], "note": j.get("note", ""), "level": j["level"],
        "levels": cluster.get("levels", 0), "dscp": j["dscp"], "rank": j["rank"],
        "intensity": j["intensity"], "k": j["k"], "flops_per_iter": m.get("flops_per_iter", 0),
        "comm_s": m.get("comm_s", 0), "period_s": m.get("period_s", 0),
        "source": m.get("source", ""), "hosts": j.get("hosts", []),
        "routes": j.get("routes", []), "qps_applied": j.get("qps_applied", 0),
        "qps_total": j.get("qps_total", 0), "decision_changes": j.get("decision_changes", 0),
        "tcp_ports_busy": j.get("tcp_ports_busy", 0), "yields_to": [], "ahead_of": [],
        "plan_known": plan is not None}
    if plan is None:
        return out
    decided = {d["job"]: d for d in plan.get("jobs", [])}
    mine = decided.get(job_id)
    shared: dict[str, list[str]] = {}
    for link in plan.get("links", []):
        if job_id in link.get("jobs", []):
            for other in link["jobs"]:
                if other != job_id:
                    shared.setdefault(other, []).append(link["link"])
    for other, links in sorted(shared.items()):
        d = decided.get(other)
        if d is None or mine is None:
            continue
        entry = {"job_id": other, "intensity": d["intensity"], "priority": d["priority"],
                 "level": d["level"], "links": links}
        (out["yields_to"] if d["rank"] < mine["rank"] else out["ahead_of"]).append(entry)
    if mine is not None:
        out["priority"] = mine["priority"]
    return out


def lines(e: dict[str, Any]) -> list[str]:
    """A person's reading of `explain`'s data."""
    out = [f"job {e['job_id']}: {e['state']}" + (f" ({e['note']})" if e["note"] else "")
           + f", level {e['level']} of {e['levels']} (DSCP {e['dscp']}), rank {e['rank']}"]
    src = f" from {e['source']}" if e["source"] else ""
    if e["state"] == "profiling":
        out.append("  why: being profiled: alone at the top level, so that its t_j and "
                   "period are measured without contention")
    elif e["state"] == "unmeasured":
        out.append("  why: not measured yet (no t_j, or no period): the lowest level until "
                   "its agent has figures")
    elif e["intensity"] is None or (isinstance(e["intensity"], float)
                                    and math.isinf(e["intensity"])):
        out.append("  why: no traffic between hosts: its I_j is infinite (∞), it contends "
                   "with nobody on the fabric")
    else:
        out.append(f"  why: I_j = W_j / t_j = {_num(e['flops_per_iter'])} FLOP / "
                   f"{_num(e['comm_s'])} s{src} = {_num(e['intensity'])} FLOP/s; k_j "
                   f"{_num(e['k'])}" + (f", priority P_j = k_j x I_j = {_num(e['priority'])}"
                                         if "priority" in e else ""))
    if not e["plan_known"]:
        out.append("  contention: unknown until the leader's next plan (its full plan is not "
                   "kept across a restart)")
    for key, verb in (("yields_to", "yields to"), ("ahead_of", "is ahead of")):
        for o in e[key]:
            links = ", ".join(o["links"][:3]) + (f" +{len(o['links']) - 3}"
                                                  if len(o["links"]) > 3 else "")
            out.append(f"  {verb} {o['job_id']} (I_j {_num(o['intensity'])}, P_j "
                       f"{_num(o['priority'])}, level {o['level']}) on {links}")
    if e["plan_known"] and not e["yields_to"] and not e["ahead_of"]:
        out.append("  contention: shares no link with another job")
    for r in e["routes"]:
        port = f"UDP sport {r['sport']}" if r.get("sport") else "no probed port (ECMP hash)"
        via = f" via {'>'.join(r['hops'])}" if r.get("hops") else ""
        tcp = (f"; TCP to port {r['tcp_dport']} from {len(r['tcp_sports'])} probed port(s)"
               if r.get("tcp_dport") and r.get("tcp_sports") else "")
        out.append(f"  path {r['src_host']}->{r['peer_host']}: {port}{via}{tcp}")
    applied = (f"{e['qps_applied']}/{e['qps_total']} QPs applied" if e["qps_total"]
               else "no QP reported by the shims")
    out.append(f"  applied: {applied}; decision changed {e['decision_changes']} time(s)"
               + (f"; {e['tcp_ports_busy']} TCP connect(s) fell back to a kernel port"
                  if e["tcp_ports_busy"] else ""))
    return out
