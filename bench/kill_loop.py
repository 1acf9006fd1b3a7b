"""Leader SIGKILLs under job churn: does any agent ever apply a generation below one it
applied before (issue 37, items 5 and 6)?

Protocol
  * A single leader (`roles = ["leader"]`, its state on disk) and --agents agent-only cruxd
    processes on loopback, sharing its token; every agent runs jobs that come and go (a
    crux-run every --churn-s on a random agent, each living 0.5-3 s), so plans keep coming.
  * Each round: run for a random 0.3-2 s, SIGKILL the leader, start it again on the same
    state directory, wait until it listens.
  * --full-disk: the leader's state directory is a 256 KiB tmpfs (root only). After a third
    of the rounds a file fills it, so the leader cannot record generations; after two thirds
    the file goes. The leader must publish nothing it did not record (item 6).
  * At the end: every agent's log, in order, gives the generations it applied ("plan N
    applied"). A generation below the previous one is a regression (the bug: 3 in 50 kills);
    the same generation applied twice is counted apart (a restarted leader re-sending what
    an agent already holds is not a reuse, unless its decisions differ: the table's digest
    is not compared here).

    .venv/bin/python bench/kill_loop.py [--kills 50] [--agents 3] [--full-disk] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import tempfile
import threading
import time
from itertools import pairwise
from pathlib import Path

# bench/ is on sys.path when run as a script
from tables import preamble, table

from cruxd.testing import Daemon, crux_run, free_port, wait_for

APPLIED = re.compile(r"plan (\d+) applied")
NOT_RECORDED = "cannot record plan generation"


def churn(agents: list[Daemon], stop: threading.Event, every_s: float,
          rng: random.Random) -> None:
    """Jobs that come and go on random agents until `stop`."""
    live: list[tuple[float, subprocess.Popen[bytes]]] = []
    n = 0
    while not stop.wait(every_s):
        now = time.monotonic()
        for end, p in [x for x in live if x[0] <= now]:
            p.kill()
            p.wait()
            live.remove((end, p))
        n += 1
        a = rng.choice(agents)
        live.append((now + rng.uniform(0.5, 3.0),
                     crux_run(a.socket, f"c{n}", "--gpus", "1", "--flops-per-iter",
                              f"{rng.uniform(1, 9):.1f}e15", "--compute-s", "1",
                              "--wait-s", "0")))
    for _, p in live:
        p.kill()
        p.wait()


def fill(path: Path) -> None:
    """Write zeros to `path` until its file system is full (ENOSPC from then on)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


def applied(d: Daemon) -> list[int]:
    return [int(m.group(1)) for m in APPLIED.finditer(d.log_text())]


def regressions(gens: list[int]) -> tuple[int, int]:
    """(applied below the previous, applied equal to the previous)."""
    down = sum(b < a for a, b in pairwise(gens))
    same = sum(b == a for a, b in pairwise(gens))
    return down, same


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--churn-s", type=float, default=0.2)
    ap.add_argument("--full-disk", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=Path, metavar="DIR",
                    help="run in DIR and keep the daemons' logs there")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="crux-kills-") as tmp:
        root = args.keep or Path(tmp)
        listen = f"127.0.0.1:{free_port()}"
        leader = Daemon(root, "lead", {
            "daemon": {"roles": ["leader"], "log_level": "info"},
            "leader": {"listen": listen, "debounce_ms": 10, "profiling_s": 0}})
        state = leader.root / "state"
        if args.full_disk:
            state.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(state)],
                           check=True)
        token = str(state / "leader.token")
        agents = [Daemon(root, f"h{i}", {
            "daemon": {"roles": ["agent"], "log_level": "info"},
            "agent": {"leader": listen, "leader_token": token, "probing": "none",
                      "addresses": [f"10.90.0.{i + 1}"], "gpus": 8, "reconnect_max_s": 0.3,
                      "report_interval_s": 0.5}}) for i in range(args.agents)]
        stop = threading.Event()
        kills = 0
        filler = state / "filler"
        started = time.monotonic()
        try:
            leader.start().wait_log("leader listening on")
            for a in agents:
                a.start()
            for a in agents:
                a.wait_log("leader 127.0.0.1")
            worker = threading.Thread(target=churn, args=(agents, stop, args.churn_s, rng))
            worker.start()
            for k in range(args.kills):
                if args.full_disk and k == args.kills // 3:
                    fill(filler)
                if args.full_disk and k == 2 * args.kills // 3:
                    filler.unlink(missing_ok=True)
                time.sleep(rng.uniform(0.3, 2.0))
                leader.send(signal.SIGKILL)
                assert leader.proc is not None
                leader.proc.wait()
                leader.proc = None
                kills += 1
                mark = len(leader.log_text())
                leader.start()
                wait_for("the leader back", lambda m=mark: "leader listening on"
                         in leader.log_text()[m:] or "cruxd: error" in leader.log_text()[m:],
                         30)
            time.sleep(2.0)
        finally:
            stop.set()
            for a in agents:
                a.stop()
            leader.stop()
            if args.full_disk:
                subprocess.run(["umount", str(state)], check=False)
        rows = []
        for a in agents:
            gens = applied(a)
            down, same = regressions(gens)
            rows.append({"agent": a.name, "applied": len(gens), "first": gens[0] if gens else 0,
                         "last": gens[-1] if gens else 0, "below_previous": down,
                         "same_as_previous": same})
        not_recorded = leader.log_text().count(NOT_RECORDED)
    doc = {"kills": kills, "agents": rows, "not_recorded_logs": not_recorded,
           "full_disk": args.full_disk, "seconds": round(time.monotonic() - started, 1)}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    preamble(f"kernel {os.uname().release}")
    print(f"{kills} leader SIGKILLs in {doc['seconds']} s; the leader logged "
          f"'{NOT_RECORDED}' {not_recorded} times")
    print(table(["agent", "plans applied", "first", "last", "below the previous",
                 "same as the previous"],
                [[r["agent"], r["applied"], r["first"], r["last"], r["below_previous"],
                  r["same_as_previous"]] for r in rows]))
    return 1 if any(r["below_previous"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
