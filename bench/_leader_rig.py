"""The processes of bench/control_plane.py: the real leader (`cruxd`, leader role) with its
config and clos2 topology files, the simulated agents' worker processes
(bench/_fake_agents.py), the real agent (`cruxd`, agent role) and its `crux-run` job;
talking to them, waiting for them to settle, and stopping every one of them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from _cp_stats import cpu_s  # bench/ is on sys.path when run as a script
from _fake_agents import worker_main
from _workload import NICS_PER_HOST, host_id, nic_address

from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb
from cruxd.rpc.gen.crux.v1 import leader_pb2_grpc as lgrpc
from cruxd.testing import Daemon, crux_run, free_port, stop_processes

HOSTS_PER_TOR = 16
AGGS = 16
SCHEDULED = (1, 2)  # JobState PROFILING, SCHEDULED (status shows QUEUED: not in the plan yet)


# --- processes --------------------------------------------------------------------

# the leader's Status lists every agent and job: more than gRPC's default 4 MB at 10,000
STATUS_MAX_BYTES = 512 << 20


class Bench:
    """Every process the benchmark starts, so that all of them are stopped. Children die
    with the benchmark (cruxd.testing's die_with_parent)."""

    def __init__(self, tmp: Path, args: argparse.Namespace) -> None:
        self.tmp = tmp
        self.args = args
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[str, Path] = {}  # "leader.log", "agent.log", "crux-run.log"
        self.workers: list[tuple[Any, Any]] = []  # (process, connection)
        self.address = ""
        self.leader: subprocess.Popen[bytes] | None = None
        self.channel: grpc.Channel | None = None
        self.stub: lgrpc.LeaderStub | None = None

    # lifecycle -------------------------------------------------------------------
    # what the shapes differ in (bench/_real_rig.py overrides these)
    nics = NICS_PER_HOST

    def topology_document(self) -> dict[str, Any]:
        hosts = self.args.agents + 1
        return {"builder": "clos2", "tors": math.ceil(hosts / HOSTS_PER_TOR), "aggs": AGGS,
                "hosts_per_tor": HOSTS_PER_TOR, "nics_per_host": NICS_PER_HOST,
                "nic_gbps": 100}

    def start_leader(self) -> None:
        topo = self.tmp / "topology.json"
        topo.write_text(json.dumps(self.topology_document()))
        self.address = f"127.0.0.1:{free_port()}"
        d = Daemon(self.tmp, "leader", {
            "daemon": {"roles": ["leader"], "log_level": "warning"},
            "leader": {"listen": self.address, "topology": str(topo), "debounce_ms": 50,
                       "profiling_s": 0, "agent_timeout_s": 120}}, die_with_parent=True)
        self.leader = self._started(d, "leader.log")
        self.token_file = d.root / "state" / "leader.token"
        self.channel = grpc.insecure_channel(
            self.address, options=[("grpc.max_receive_message_length", STATUS_MAX_BYTES)])
        try:
            grpc.channel_ready_future(self.channel).result(timeout=60)
        except grpc.FutureTimeoutError:
            raise RuntimeError(f"leader did not listen on {self.address}: "
                               f"{self.log_tail('leader.log')}") from None
        self.stub = lgrpc.LeaderStub(self.channel)
        self.token = self.token_file.read_text().strip()  # written before the port opens

    def start_agent(self) -> tuple[subprocess.Popen[bytes], Path]:
        """The real agent on the topology's spare host; returns it and its local socket."""
        me = self.args.agents  # the topology's spare host
        run = self.tmp / "agent" / "run"  # the runtime_dir Daemon gives it
        d = Daemon(self.tmp, "agent", {
            "daemon": {"roles": ["agent"], "host_id": host_id(me), "log_level": "warning"},
            "agent": {"leader": self.address, "leader_token": str(self.token_file),
                      "addresses": [nic_address(me, p) for p in range(self.nics)],
                      "gpus": 8, "socket": str(run / "agent.sock"),
                      "decision_table": str(run / "decisions")}}, die_with_parent=True)
        return self._started(d, "agent.log"), d.socket

    def start_job(self, sock: Path) -> None:
        """One job registered with the real agent: `crux-run ... -- sleep 600`."""
        log = self.logs["crux-run.log"] = self.tmp / "crux-run.log"
        self.procs.append(crux_run(sock, "bench-job", "--gpus", "8", "--flops-per-iter", "1e15",
                                   "--allreduce-bytes", "1e9", "--compute-s", "0.5",
                                   log=log, die_with_parent=True))

    def _started(self, d: Daemon, log: str) -> subprocess.Popen[bytes]:
        d.start()
        assert d.proc is not None
        self.logs[log] = d.log
        self.procs.append(d.proc)
        return d.proc

    def log_tail(self, log: str, n: int = 10) -> str:
        """The last lines of a process's log ("leader.log", "agent.log", "crux-run.log")."""
        try:
            return " | ".join(self.logs[log].read_text().splitlines()[-n:])
        except (KeyError, OSError):
            return "(no log)"

    def start_workers(self) -> list[list[int]]:
        a = self.args
        ranges = [list(r) for r in np.array_split(np.arange(a.agents), a.workers)]
        ranges = [[int(h) for h in r] for r in ranges]
        self.spawn_workers([(hosts, a.agents, a.jobs, a.seed, a.report_interval, False,
                             self.token) for hosts in ranges])
        return ranges

    def spawn_workers(self, args: list[tuple[Any, ...]]) -> None:
        """One worker process per tuple (worker_main's arguments after the pipe and the
        leader's address); returns once every one has said it is up."""
        ctx = mp.get_context("spawn")
        for worker_args in args:
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=worker_main, daemon=True,
                            args=(theirs, self.address, *worker_args))
            p.start()
            self.workers.append((p, mine))
        for _, conn in self.workers:
            if not conn.poll(120):
                raise RuntimeError("a worker process did not start")
            conn.recv()

    def stop(self) -> None:
        for _, conn in self.workers:
            with contextlib.suppress(Exception):
                conn.send(("stop", None))
        for p, _ in self.workers:
            with contextlib.suppress(Exception):
                p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
        if self.channel is not None:
            self.channel.close()
        stop_processes(self.procs[::-1])  # crux-run, the agent, then the leader

    # talking to workers, the leader and the real agent -------------------------------
    def ask(self, which: Sequence[int], cmd: str, arg: Any = None, timeout: float = 300
            ) -> list[Any]:
        for w in which:
            self.workers[w][1].send((cmd, arg))
        out = []
        for w in which:
            conn = self.workers[w][1]
            if not conn.poll(timeout):
                raise RuntimeError(f"worker {w}: no answer to {cmd} in {timeout:g} s")
            kind, res = conn.recv()
            if kind != "ok":
                raise RuntimeError(f"worker {w}: {cmd}: {res}")
            out.append(res)
        return out

    def all_workers(self) -> list[int]:
        return list(range(len(self.workers)))

    def generations(self) -> list[int]:
        return [g for gens in self.ask(self.all_workers(), "generations") for g in gens]

    def status(self) -> Any:
        assert self.stub is not None
        return self.stub.Status(lpb.StatusRequest(), timeout=30,
                                metadata=(("authorization", f"Bearer {self.token}"),))

    def errors(self) -> dict[str, int]:
        """Failed RPCs of the simulated agents so far, by method and status code."""
        return self.tally("errors")

    def tally(self, cmd: str) -> dict[str, int]:
        """A worker command's counts (a dict of ints from each worker), summed."""
        out: dict[str, int] = {}
        for counts in self.ask(self.all_workers(), cmd):
            for k, v in counts.items():
                out[k] = out.get(k, 0) + v
        return out

    def worker_cpu_s(self) -> float:
        return sum(cpu_s(p.pid) for p, _ in self.workers)

    def errors_since(self, before: dict[str, int]) -> str:
        now = self.errors()
        diff = {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}
        return ", ".join(f"{v} {k}" for k, v in sorted(diff.items())) or "none"

    def wait_steady(self, timeout: float = 300) -> Any:
        """The leader's plan has every job it knows planned (none waiting for a plan or for
        its other hosts) and every agent holds that plan's generation. Returns the status."""
        end = time.monotonic() + timeout
        why, said = "", time.monotonic()
        while time.monotonic() < end:
            gens = self.generations()
            pause = 0.5
            if gens and min(gens) == max(gens) > 0:
                t0 = time.monotonic()
                st = self.status()
                # a status of 10,000 agents costs the leader most of a second: polling it
                # every 0.5 s would be the leader's main load
                pause = max(pause, 4 * (time.monotonic() - t0))
                waiting = [j.job_id for j in st.jobs if j.state not in SCHEDULED]
                if (st.plan_generation == gens[0] and len(st.agents) >= self.args.agents
                        and not waiting):
                    return st
                why = (f"plan {st.plan_generation}, agents hold {gens[0]}; "
                       f"{len(st.agents)} agents; {len(waiting)} jobs not scheduled "
                       f"{waiting[:3]}")
            else:
                why = f"agents hold generations {min(gens)}..{max(gens)}" if gens else ""
            if time.monotonic() - said > 30:
                print(f"    ... not steady yet: {why}", file=sys.stderr, flush=True)
                said = time.monotonic()
            time.sleep(pause)
        raise RuntimeError(f"no steady state in {timeout:g} s ({why})")

    def wait_agent(self, agent: subprocess.Popen[bytes], sock: Path, want_jobs: int,
                   before: int) -> int:
        """The leader re-planned (agent joined / job arrived) past generation `before`: wait
        until the real agent holds `want_jobs` jobs and everybody has that plan."""
        end = time.monotonic() + 180
        while time.monotonic() < end:
            if agent.poll() is not None:
                raise RuntimeError(f"agent exited ({agent.returncode}): "
                                   f"{self.log_tail('agent.log')}")
            with contextlib.suppress(Exception):
                g, jobs = agent_generation(sock)
                gens = self.generations()
                if jobs == want_jobs and g > before and min(gens) == max(gens) == g:
                    return g
            time.sleep(0.5)
        raise RuntimeError("the real agent did not settle in 180 s")


def agent_generation(sock: Path) -> tuple[int, int]:
    """(applied generation, jobs) of a real agent, over its local socket."""
    from cruxd.rpc.local import LocalClient

    req = apb.LocalRequest()
    req.status.local_only = True
    reply = LocalClient(sock).call(req)
    return reply.status.agent.applied_generation, len(reply.status.agent.jobs)
