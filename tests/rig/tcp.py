"""TCP on the rig: iperf3 listeners, the TCP TTL prober run inside a host, the
connections a listener holds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.rig.fabric import Fabric, RigError, can_build

_SWEEP = """
import json, sys
from probing.sweep import sweep
from probing.tcp_ttl import TcpTtlProber
peer, args = sys.argv[1], json.loads(sys.argv[2])
known = {int(k): tuple(v) for k, v in args.get("known", {}).items()}
with TcpTtlProber(peer, dport=args["dport"], known=known) as p:
    if args.get("port"):
        print(json.dumps({"hops": p.trace(args["port"]), "reasons": p.counters.reasons}))
        sys.exit()
    doc = sweep(p, peer, range(args["start"], 65536), expected=args.get("expected"),
                ports_per_path=args["per_path"], max_probes=args["max_probes"]).to_json()
    doc["ignored"] = p.counters.ignored
    doc["reasons"] = p.counters.reasons
    doc["segments"] = p.counters.sent
    print(json.dumps(doc))
"""


def can_listen() -> str | None:
    """None when iperf3 is here, else the reason the TCP rig tests skip."""
    if shutil.which("iperf3") is None:
        return "needs iperf3 (apt-get install iperf3)"
    return None


def can_steer_tcp() -> str | None:
    """None when TCP jobs can be steered on a rig here (a fabric, iperf3, and the socket
    interposer that crux-run preloads), else the reason."""
    from transport import native
    if (why := can_build() or can_listen()) is not None:
        return why
    try:
        native.library(native.SOCK)
    except native.NativeLibraryMissing as exc:
        return f"the socket interposer is not built: {exc}"
    return None


def tcp_sweep_from(f: Fabric, src: str, dst: str, dport: int, *, expected: int | None = None,
                   ports_per_path: int = 1, max_probes: int = 400,
                   start: int = 61000) -> dict[str, Any]:
    """One TCP sweep from `src` toward `dst`:`dport` (ports from `start` upward):
    SweepResult.to_json() plus `ignored` replies, their `reasons` and `segments` sent."""
    args = {"dport": dport, "expected": expected, "per_path": ports_per_path,
            "max_probes": max_probes, "start": start}
    run = f.exec(src, sys.executable, "-c", _SWEEP, f.address(dst), json.dumps(args),
                 timeout=120)
    assert run.returncode == 0, run.stderr
    doc: dict[str, Any] = json.loads(run.stdout)
    return doc


def tcp_trace_from(f: Fabric, src: str, dst: str, dport: int, sport: int,
                   known: dict[int, list[str]] | None = None) -> dict[str, Any]:
    """One trace: {"hops": [...] or None, "reasons": ignored replies by reason}."""
    args = {"dport": dport, "port": sport, "known": known or {}}
    run = f.exec(src, sys.executable, "-c", _SWEEP, f.address(dst), json.dumps(args),
                 timeout=60)
    assert run.returncode == 0, run.stderr
    doc: dict[str, Any] = json.loads(run.stdout)
    return doc


def tcp_states(f: Fabric, host: str, state: str, port: int) -> list[str]:
    """`ss` lines of `host`'s TCP sockets in `state` (e.g. "syn-recv") on local `port`."""
    run = f.exec(host, "ss", "-Htn", "state", state, f"( sport = :{port} )")
    if run.returncode != 0:
        raise RigError(f"ss on {host}: {run.stderr.strip()}")
    return [line for line in run.stdout.splitlines() if line.strip()]


@contextmanager
def iperf3_servers(f: Fabric, hosts: list[str], port: int = 5201) -> Iterator[None]:
    """`iperf3 -s -p port` on each host (a real TCP listener), stopped on the way out."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for h in hosts:
            procs.append(subprocess.Popen(["ip", "netns", "exec", f.ns(h), "iperf3", "-s",
                                           "-p", str(port)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        for h, p in zip(hosts, procs, strict=True):
            end = time.monotonic() + 20
            while not tcp_states(f, h, "listening", port):
                if p.poll() is not None or time.monotonic() > end:
                    err = p.stderr.read().decode() if p.stderr and p.poll() is not None else ""
                    raise RigError(f"iperf3 -s on {h} did not listen on {port}: {err}")
                time.sleep(0.05)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()
