"""bench/ha.py --simulated N: failover with N simulated agents (bench/_fake_agents.py) on
the real shape (clos3 topology, the trace's job mix; bench/_cluster_shapes.py), against
the HA rig's real etcd and three real leader candidates (cruxd.testing.ha_rig).

Each round: wait for the steady state (every job planned, every agent on the plan); SIGKILL
the active leader at t0; then each simulated agent notes when it follows another leader: a
plan stream open on it (a standby refuses streams, naming the active leader), and, where
that leader's view lacks the host's latest acked report (the stream's metadata says so),
that report acked by it. The agents follow a standby's refusal to the leader it names,
else try the next candidate, at most 1 s apart, as the real agent's uplink does. So
"following" means: the new leader has the host's current state in its view, and the host's
plan stream is open on it.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from _cluster_shapes import clos3_document, clos3_pods, real_workload
from _cp_stats import cpu_s, mem_mb
from _leader_rig import STATUS_MAX_BYTES
from _real_rig import RealBench, worker_ranges

from cruxd.rpc.gen.crux.v1 import leader_pb2_grpc as lgrpc
from cruxd.testing import wait_for
from cruxd.testing.ha_rig import HaRig

# the winner's log line (cruxd.leader.ha): how long the takeover read and rebuilt the
# state, and whether from the standby's copy or decoded then
TAKEOVER = re.compile(r"state read in (?P<read>[\d.]+) s, rebuilt in (?P<rebuilt>[\d.]+) s, "
                      r"(?P<source>[^)]*)\)")


def _point_at(b: RealBench, rig: HaRig, name: str) -> None:
    """The bench's Status stub on candidate `name` (a status of 10,000 agents is ~5 MB)."""
    if b.channel is not None:
        b.channel.close()
    b.channel = grpc.insecure_channel(
        rig.addresses[name], options=[("grpc.max_receive_message_length", STATUS_MAX_BYTES)])
    b.stub = lgrpc.LeaderStub(b.channel)  # type: ignore[no-untyped-call]


def one_kill(b: RealBench, rig: HaRig, timeout_s: float) -> dict[str, Any]:
    active = rig.active()
    assert active is not None and active.proc is not None
    _point_at(b, rig, active.name)
    st = b.wait_steady(timeout_s)
    term, gen, rss = st.term, st.plan_generation, mem_mb(active.proc.pid)["VmRSS"]
    errs0 = b.errors()
    others = [d for d in rig.leaders if d is not active]
    offsets = {d.name: len(d.log_text()) for d in others}
    # where the box's 2 cores go during the failover: the simulated agents' workers, the
    # candidates left (the new leader and a standby)
    cpu0 = b.worker_cpu_s(), {d.name: cpu_s(d.proc.pid) for d in others if d.proc}
    print(f"    ... SIGKILL {active.name} (pid {active.proc.pid})", file=sys.stderr, flush=True)
    active.send(signal.SIGKILL)
    t0, wall0 = time.monotonic(), time.time()
    elected: list[float] = []

    def watch_election() -> None:  # standbys answer Status cheaply; stop at the first active
        while time.monotonic() - t0 < timeout_s and not elected:
            if rig.active(others) is not None:
                elected.append(time.monotonic() - t0)
            time.sleep(0.2)

    watcher = threading.Thread(target=watch_election, daemon=True)
    watcher.start()
    per_agent = [t for ts in b.ask(b.all_workers(), "wait_followed",
                                   (t0, rig.addresses[active.name], timeout_s),
                                   timeout=timeout_s + 30) if ts is not None for t in ts]
    if len(per_agent) != b.args.agents:
        raise RuntimeError(f"not every agent followed within {timeout_s:g} s: agents by "
                           f"the address they talk to {b.tally('where')}; failed RPCs "
                           f"{b.errors_since(errs0)}")
    lat = np.array(per_agent) - t0
    window = time.monotonic() - t0
    cpu = {"workers": b.worker_cpu_s() - cpu0[0],
           **{n: cpu_s(d.proc.pid) - cpu0[1][n] for d in others
              if d.proc and (n := d.name) in cpu0[1]}}
    watcher.join()
    active.proc.wait()
    active.proc = None
    new = rig.active(others)
    assert new is not None
    _point_at(b, rig, new.name)
    after = b.wait_steady(timeout_s)
    row = {"elected_s": elected[0] if elected else float("nan"),
           "first_s": float(lat.min()), "median_s": float(np.median(lat)),
           "p99_s": float(np.percentile(lat, 99)), "all_s": float(lat.max()),
           "old_term": term, "new_term": after.term, "generation_before": gen,
           "generation_after": after.plan_generation, "steady_s": time.monotonic() - t0,
           "leader_rss_mb": rss, "errors": b.errors_since(errs0),
           "cpu_pct": {k: 100 * v / window for k, v in cpu.items()}, "window_s": window,
           "takeover": "?"}
    print(f"    ... CPU from the kill until every agent followed ({window:.1f} s), % of one "
          f"core (the box has 2): " + ", ".join(f"{k} {v:.0f} %" for k, v in
                                                row["cpu_pct"].items()), file=sys.stderr)
    print(f"    ... killed {active.name} at {time.strftime('%H:%M:%S', time.localtime(wall0))}"
          f".{int(wall0 % 1 * 1000):03d}; the others' log since:", file=sys.stderr)
    for d in others:
        for line in d.log_text()[offsets[d.name]:].splitlines()[:12]:
            print(f"      {d.name}: {line}", file=sys.stderr)
            if m := TAKEOVER.search(line):
                row["takeover"] = (f"{m['read']}+{m['rebuilt']} s, "
                                   + ("copy" if "copy" in m["source"] else "decoded"))
    active.start()  # back as a standby for the next round
    wait_for("the killed leader back as a standby",
             lambda: (s := rig.status(active, brief=True)) is not None
             and s.ha_role == "standby", 60)
    return row


def _logs(rig: HaRig) -> None:
    for d in rig.leaders:
        lines = d.log_text().splitlines() if d.log.exists() else []
        tail = [x for x in lines if " INFO " not in x][-12:]
        print(f"--- {d.name} {rig.addresses[d.name]} (warnings and errors):\n"
              + "\n".join(tail), file=sys.stderr)


def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.simulated
    ns = argparse.Namespace(agents=n, seed=0, report_interval=300.0)
    ranges = worker_ranges(n, 4)
    specs, _ = real_workload(n, 2000 * n // 10000 or 1, ranges, 0, 0)
    rows = []
    root = Path(args.tmp)
    topo = root / "topology.json"
    topo.write_text(json.dumps(clos3_document(clos3_pods(n))))
    # a large cluster's timeouts: keepalive every 10 s (pings from every stream), hosts
    # kept 120 s without a stream (as bench/control_plane.py's leader)
    rig = HaRig(root, agents_n=0, lease_s=args.lease_s,
                leader_extra={"topology": str(topo), "debounce_ms": 50,
                              "agent_timeout_s": 120},
                control_extra={"keepalive_s": 10}, leader_log_level="info")
    b = RealBench(root / "bench", ns)
    try:
        rig.start()
        b.address, b.token = ",".join(rig.addresses.values()), rig.token
        b.start_shaped_workers(ranges, specs, args.agents_per_channel)
        started = time.monotonic()
        b.ask(b.all_workers(), "connect", (300.0,), timeout=330)
        print(f"    ... {n} simulated agents reported in {time.monotonic() - started:.1f} s;"
              f" {len(specs)} jobs", file=sys.stderr, flush=True)
        for i in range(args.kills):
            try:
                rows.append(one_kill(b, rig, 300.0))
            except RuntimeError:
                _logs(rig)
                raise
            r = rows[-1]
            print(f"    ... kill {i + 1}/{args.kills}: every agent following after "
                  f"{r['all_s']:.2f} s (median {r['median_s']:.2f} s), steady after "
                  f"{r['steady_s']:.1f} s; failed RPCs: {r['errors']}",
                  file=sys.stderr, flush=True)
    finally:
        b.stop()
        rig.stop()
    return {"agents": n, "jobs": len(specs), "per_channel": args.agents_per_channel,
            "kills": rows}


def stop_on_term() -> None:
    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
