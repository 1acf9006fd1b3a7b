"""`cruxctl doctor`: check this host against what crux needs, one line per check.

ok / warn / fail / unknown, each but ok with its fix; `--json` for scripts; exit status 1
when a check fails (0 otherwise, warnings included). The checks are in cruxd/doctor/;
this module adds the two that are about this install and this user: the job-side libraries
load the way a job loads them, and the agent's socket answers the invoking user.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cruxd.errors import UsageError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "doctor", help="check this host against what crux needs (RDMA, DSCP trust, PFC, ECN, "
                       "ports, rp_filter, libraries, the agent)",
        description="Check this host, one line per check (ok, warn, fail or unknown, and the "
                    "fix): its RDMA devices, ports and RoCE v2 GIDs; the NIC's traffic-class "
                    "override; per interface, DSCP trust, PFC on the priorities crux's levels "
                    "use, and ECN/CNP; the kernel's ephemeral ports against [probing] "
                    "tcp_sports; rp_filter and the multipath hash policy; whether the job-side "
                    "libraries load; whether the agent's socket answers you. "
                    "docs/operations.md says what to set on the switches.",
        epilog="Exit status: 0 no check failed (warnings allowed), 1 a check failed, 2 bad "
               "input.")
    p.add_argument("--config", metavar="FILE", type=Path,
                   help="the host's cruxd configuration (levels, DSCP, tcp_sports, addresses, "
                        "socket); default: the embedded one")
    p.add_argument("--interface", action="append", default=[], metavar="DEV",
                   help="check these netdevs (default: the RDMA ports' and the configured "
                        "addresses')")
    p.add_argument("--socket", metavar="PATH", help="the agent socket to try")
    p.add_argument("--sysfs", type=Path, default=Path("/sys"), metavar="DIR",
                   help="where sysfs is (default /sys)")
    p.add_argument("--proc", type=Path, default=Path("/proc"), metavar="DIR",
                   help="where procfs is (default /proc)")
    p.add_argument("--json", action="store_true", help="print JSON")


def cmd_doctor(args: argparse.Namespace) -> int:
    from cruxd.agent.inventory import netdevs_for
    from cruxd.config.parse import load_config
    from cruxd.doctor import checks as c
    from cruxd.doctor import dcb
    from cruxd.scheduler.dscp import level_dscp

    try:
        config = load_config(args.config)
    except FileNotFoundError:
        raise UsageError(f"no such configuration file: {args.config}") from None
    lc = config.leader
    dscp = level_dscp(lc.levels, lc.dscp)
    ports = c.rdma_ports(args.sysfs)
    devs = list(dict.fromkeys(args.interface or [
        *(d for p in ports for d in p.netdevs), *netdevs_for(config.agent.addresses)]))
    missing = [d for d in args.interface if not (args.sysfs / "class" / "net" / d).exists()]
    if missing:
        raise UsageError(f"no such interface under {args.sysfs}/class/net: {missing[0]}")
    found = [c.check_rdma(ports), c.check_tc_override(args.sysfs)]
    for dev in devs:
        found += [dcb.check_trust(dev),
                  dcb.check_pfc(dev, dscp, lossless=lc.lossless_priorities),
                  dcb.check_ecn(args.sysfs, dev, dscp)]
    found += [c.check_port_range(args.proc, config.probing.tcp_sports),
              c.check_rp_filter(args.proc, devs), c.check_multipath_hash(args.proc),
              *_libraries(), _agent(args.socket or (str(config.agent.socket)
                                                    if args.config else None))]
    failed = any(x.status == c.FAIL for x in found)
    if args.json:
        json.dump({"checks": [asdict(x) for x in found], "failed": failed}, sys.stdout,
                  indent=2)
        sys.stdout.write("\n")
    else:
        _print(found)
    return 1 if failed else 0


def _print(found: list[Any]) -> None:
    from rich.markup import escape

    from cruxd.cli.common import console

    out = console()
    style = {"ok": "green", "warn": "yellow", "fail": "red", "unknown": "dim"}
    for x in found:
        out.print(f"[{style[x.status]}]{x.status:7}[/] {escape(x.name)}: {escape(x.detail)}")
        if x.fix:
            out.print(f"        fix: {escape(x.fix)}")


def _libraries() -> list[Any]:
    """Each job-side library preloaded into /bin/true, as a job's loader would: a library
    that cannot load (libibverbs missing, a wrong architecture) says so."""
    from cruxd.doctor.checks import FAIL, OK, Check
    from transport import native

    out = []
    for name, what in ((native.IBVERBS, "the wrapper libibverbs"),
                       (native.SOCK, "the socket interposer"),
                       (native.NCCL_PROFILER, "the NCCL profiler plugin")):
        try:
            path = native.library(name)
        except native.NativeLibraryMissing as exc:
            out.append(Check(f"library {name}", FAIL, f"{what}: {exc}",
                             "reinstall crux (pip install .)"))
            continue
        r = subprocess.run(["/bin/true"], env={"LD_PRELOAD": str(path)}, capture_output=True,
                           text=True, timeout=10, check=False)
        if r.returncode != 0 or "cannot be preloaded" in r.stderr or "error" in r.stderr:
            why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
            out.append(Check(f"library {name}", FAIL, f"{what} does not load: {why}",
                             "install rdma-core's libibverbs (Debian: ibverbs-providers)"
                             if name == native.IBVERBS else "reinstall crux"))
        else:
            out.append(Check(f"library {name}", OK, f"{what} loads ({path})"))
    return out


def _agent(explicit: str | None) -> Any:
    from cruxd.cli.agent_finder import find_agent
    from cruxd.doctor.checks import FAIL, OK, Check
    from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
    from cruxd.rpc.local import AgentUnavailable, LocalClient

    search = find_agent(explicit)
    if search.place is None:
        return Check("agent", FAIL, search.why_none, "start cruxd (systemctl start cruxd)")
    req = apb.LocalRequest()
    req.info.SetInParent()
    try:
        reply = LocalClient(search.place.socket, timeout=3.0).call(req)
    except AgentUnavailable as exc:
        return Check("agent", FAIL, f"{search.place.socket} ({search.place.origin}): {exc}",
                     "run as a member of the agent's group (agent.socket_group, default "
                     "crux): usermod -aG crux $USER, then log in again")
    if reply.WhichOneof("body") == "error":
        return Check("agent", FAIL, f"{search.place.socket}: {reply.error.message}",
                     "see the agent's log: journalctl -u cruxd")
    return Check("agent", OK, f"{search.place.socket} ({search.place.origin}) answers this user: "
                 f"host {reply.info.host_id}")
