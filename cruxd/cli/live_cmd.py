"""cruxctl's live commands: status, jobs and plan --live, from the running daemons.

They ask the local agent over its Unix socket (the agent adds the leader's view),
or the leader directly with --leader. JSON output is the protobuf messages with the field
names of proto/crux/v1, every field present, in plain JSON values (`to_json`), so scripts can
rely on the schema.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from cruxd.errors import CruxError, UsageError

UNREACHABLE = 3  # exit status: no agent / leader answered


class Unreachable(CruxError):
    exit_status = UNREACHABLE


def add_target_args(p: argparse.ArgumentParser, leader: bool = True,
                    json: bool = True) -> None:
    p.add_argument("--socket", metavar="PATH",
                   help="the agent's socket (default: agent.socket of --config, else "
                        "$CRUX_SOCKET, else the host's agent at /run/crux/agent.sock, else "
                        "this user's own agent's)")
    p.add_argument("--config", metavar="FILE", type=Path,
                   help="read the socket path and TLS files from this cruxd configuration")
    if leader:
        p.add_argument("--leader", metavar="HOST:PORT",
                       help="ask the leader directly over gRPC instead of the local agent")
    if json:
        p.add_argument("--json", action="store_true", help="print JSON (stable field names)")


def _config(args: argparse.Namespace) -> Any:
    from cruxd.config.parse import load_config

    return load_config(args.config)


def agent_socket(explicit: str | None, config: Path | None) -> str:
    """The agent socket to use: given, else that configuration file's agent.socket, else the
    agent that serves this user (agent_finder.py: $CRUX_SOCKET, the host's agent, this
    user's own)."""
    if config is not None and not explicit:
        from cruxd.config.parse import load_config

        return str(load_config(config).agent.socket)
    from cruxd.cli.agent_finder import find_agent

    search = find_agent(explicit)
    if search.place is None:
        raise Unreachable(search.why_none)
    return str(search.place.socket)


def socket_path(args: argparse.Namespace) -> str:
    return agent_socket(args.socket, args.config)


def to_json(msg: Message) -> dict[str, Any]:
    """`msg` as plain JSON values, unlike protobuf's own JSON mapping: 64-bit integers as
    numbers (not strings), enum values as their lower-case names without the type's prefix
    (JOB_STATE_EXPIRED: "expired"), a float that is not finite (a network-free job's
    infinite I_j) as null, as `cruxctl plan --json` writes it. Every field is present but a
    message field that is not set (absent, as protobuf's mapping has it) and the members of a
    oneof that are not set."""
    out: dict[str, Any] = {}
    for f in msg.DESCRIPTOR.fields:
        if f.containing_oneof is not None and msg.WhichOneof(f.containing_oneof.name) != f.name:
            continue
        value = getattr(msg, f.name)
        kind = f.message_type
        if kind is not None and kind.GetOptions().map_entry:
            item = kind.fields_by_name["value"]
            out[f.name] = {str(k): _value(item, v) for k, v in value.items()}
        elif f.is_repeated:
            out[f.name] = [_value(f, v) for v in value]
        elif f.type == f.TYPE_MESSAGE and not msg.HasField(f.name):
            continue
        else:
            out[f.name] = _value(f, value)
    return out


def _value(f: Any, v: Any) -> Any:
    if f.type == f.TYPE_MESSAGE:
        return to_json(v)
    if f.type == f.TYPE_ENUM:
        value = f.enum_type.values_by_number.get(v)
        if value is None:
            return v  # a newer peer's value: the number
        prefix = "".join(f"_{c}" if c.isupper() else c.upper()
                         for c in f.enum_type.name).lstrip("_") + "_"
        return str(value.name).removeprefix(prefix).lower()
    if f.type in (f.TYPE_DOUBLE, f.TYPE_FLOAT):
        return v if math.isfinite(v) else None
    if f.type == f.TYPE_BYTES:
        return base64.b64encode(v).decode()
    return v


def local(args: argparse.Namespace, body: str, **fields: Any) -> Any:
    from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
    from cruxd.rpc.local import UNAVAILABLE, AgentUnavailable, LocalClient

    req = apb.LocalRequest()
    getattr(req, body).SetInParent()
    for k, v in fields.items():
        setattr(getattr(req, body), k, v)
    try:
        reply = LocalClient(socket_path(args)).call(req)
    except AgentUnavailable as exc:
        raise Unreachable(str(exc)) from None
    if reply.WhichOneof("body") == "error":
        code = reply.error.code
        raise (Unreachable if code == UNAVAILABLE else CruxError)(f"agent: {reply.error.message}")
    return reply


def leader_call(args: argparse.Namespace, method: str, request: Any = None) -> Any:
    import asyncio

    import grpc

    from cruxd.config.hostport import parse_hostport
    from cruxd.rpc import tls
    from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb
    from cruxd.rpc.gen.crux.v1 import leader_pb2_grpc as lgrpc

    try:
        parse_hostport(args.leader)
    except ValueError as exc:
        raise UsageError(f"--leader: {exc}") from None
    from cruxd.leader.auth import call_metadata

    config = _config(args)  # the embedded default without --config: this host's token
    tls_config = config.tls if args.config else None
    metadata = call_metadata(config.agent.leader_token)

    async def call() -> Any:
        from cruxd.config.model import TlsConfig

        ch = tls.channel(args.leader, tls_config or TlsConfig(None, None, None, None),
                         config.control.dscp)
        try:
            stub = lgrpc.LeaderStub(ch)  # type: ignore[no-untyped-call]
            req = request or (lpb.StatusRequest() if method == "Status"
                              else lpb.PlanRequest())
            return await getattr(stub, method)(req, timeout=5.0, metadata=metadata)
        finally:
            await ch.close()

    try:
        return asyncio.run(call())
    except grpc.aio.AioRpcError as exc:
        raise Unreachable(f"leader {args.leader}: {exc.code().name}: {exc.details()}") from None


def cmd_status(args: argparse.Namespace) -> int:
    if getattr(args, "job", None):
        return _explain(args)
    if args.leader:
        cluster = leader_call(args, "Status")
        doc: dict[str, Any] = {"agent": None, "cluster": to_json(cluster)}
        agent = None
    else:
        reply = local(args, "status", local_only=args.local)
        status = reply.status
        agent = status.agent
        cluster = status.cluster if status.HasField("cluster") else None
        doc = {"agent": to_json(agent), "cluster": to_json(cluster) if cluster else None}
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:  # the tables (rich) only for people: --json stays quick
        from cruxd.cli.common import console as _console
        from cruxd.cli.safe_text import scrub
        from cruxd.cli.status_view import print_status

        # every string came from jobs, other users or hosts: made safe for rich and a tty
        print_status(_console(), agent and scrub(agent), cluster and scrub(cluster),
                     time.time())
    return 0


def _explain(args: argparse.Namespace) -> int:
    """`cruxctl status JOB`: the leader's view of one job, and why (cruxd/cli/explain.py)."""
    from cruxd.cli.explain import explain, lines

    if args.leader:
        cluster: Any = leader_call(args, "Status")
        try:
            plan_doc: Any = leader_call(args, "GetPlan")
        except CruxError:  # no plan yet
            plan_doc = None
    else:
        status = local(args, "status").status
        if not status.HasField("cluster"):
            raise Unreachable(f"the leader did not answer the agent: "
                              f"{status.agent.leader_error or 'no cluster view'}")
        cluster = status.cluster
        try:
            plan_doc = local(args, "plan").plan
        except CruxError:
            plan_doc = None
    plan = json.loads(plan_doc.json).get("plan") if plan_doc is not None else None
    try:
        e = explain(args.job, to_json(cluster), plan)
    except KeyError:
        known = ", ".join(j.job_id for j in cluster.jobs) or "none"
        raise UsageError(f"no job {args.job!r} in the leader's view (jobs: {known})") from None
    if args.json:
        json.dump(e, sys.stdout, indent=2, allow_nan=False, default=str)
        sys.stdout.write("\n")
    else:
        from cruxd.cli.common import console as _console
        from cruxd.cli.safe_text import safe

        out = _console()
        for line in lines(e):
            out.print(safe(line))
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    reply = local(args, "jobs")
    if args.json:
        json.dump(to_json(reply.jobs), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from cruxd.cli.common import console as _console
        from cruxd.cli.safe_text import scrub
        from cruxd.cli.status_view import print_jobs

        print_jobs(_console(), list(scrub(reply.jobs).jobs))
    return 0


def cmd_plan_live(args: argparse.Namespace) -> int:
    doc = (leader_call(args, "GetPlan") if args.leader else local(args, "plan").plan)
    plan = json.loads(doc.json)
    if args.json:
        json.dump(plan, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from cruxd.cli.common import console as _console
    from cruxd.cli.status_view import print_live_plan

    print_live_plan(_console(), plan)
    return 0


__all__ = ["UNREACHABLE", "add_target_args", "cmd_jobs", "cmd_plan_live", "cmd_status",
           "leader_call", "local", "socket_path", "to_json"]
