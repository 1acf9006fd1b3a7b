"""crux-run: register a job with the local crux agent, wait for its first decision, then
become the job.

    crux-run [--job-id ID] [--gpus N] ... -- COMMAND [ARGS...]

    crux-run --print-env [--job-id ID]

It finds the agent that serves this user (cruxd/cli/agent_finder.py: the host's agent at
/run/crux/agent.sock, for every user in group crux), registers over its socket, waits (bounded,
cruxd/cli/start_wait.py) until the job's first decision is in the table, and then exec()s
COMMAND in its own process, so the pid the agent watches (from SO_PEERCRED) is the job itself:
when the job ends, however it ends, the agent drops it. COMMAND gets CRUX_JOB_ID and
CRUX_DECISION_TABLE in its environment, and the job-side libraries (cruxd/cli/job_env.py): the
wrapper libibverbs for NCCL of every generation (LD_LIBRARY_PATH and NCCL_IBVERBS_LIB) and the
socket interposer (LD_PRELOAD). Without an agent the command runs exactly as it would without
crux (fail open), after one warning, and loads none of them.

Exit status: COMMAND's; 2 for bad arguments; 127 when COMMAND cannot be run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from cruxd import __version__
from cruxd.cli.agent_finder import find_agent
from cruxd.cli.exits import run_command
from cruxd.cli.job_env import job_env, render_exports
from cruxd.cli.start_wait import wait_for_decision
from cruxd.errors import CruxError, UsageError

ENV_JOB = ("CRUX_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
MAX_TCP_PORTS = 16  # the agent's bound (cruxd.control.validate.MAX_JOB_TCP_PORTS)


class NotRunnable(CruxError):
    """COMMAND cannot be exec()ed (not found, not executable): the shell's status."""

    exit_status = 127


def _env_int(*names: str) -> int | None:
    for n in names:
        v = os.environ.get(n, "")
        if v.isdigit():
            return int(v)
    return None


def _gpus() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    return _env_int("SLURM_GPUS_ON_NODE", "LOCAL_WORLD_SIZE") or 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="crux-run",
        usage="crux-run [options] -- COMMAND [ARGS...]\n       crux-run --print-env [options]",
        description="Register a training job with the local crux agent, then run it (the "
                    "job keeps crux-run's pid, so the agent sees it exit).",
        epilog="Defaults come from the launcher's environment: job id from CRUX_JOB_ID, "
               "SLURM_JOB_ID or TORCHELASTIC_RUN_ID; node rank from NODE_RANK or "
               "SLURM_NODEID; nodes from NNODES or SLURM_NNODES; GPUs from "
               "CUDA_VISIBLE_DEVICES, SLURM_GPUS_ON_NODE or LOCAL_WORLD_SIZE. Declared "
               "figures (--flops-per-iter, ...) are hints the agent may use until it "
               "measures the job; they never set a priority. CRUX_JOB_KEY (16 bytes or "
               "more, the same for every rank) proves that the job's parts on different "
               "hosts are one job; without it, that they run as one user. Exit status: "
               "COMMAND's; "
               "2 bad arguments; 127 COMMAND not runnable.")
    p.add_argument("--version", action="version", version=f"crux-run {__version__}")
    p.add_argument("--job-id", metavar="ID", help="the job's id, the same on every host")
    p.add_argument("--gpus", type=int, metavar="N", help="GPUs the job uses on this host")
    p.add_argument("--node-rank", type=int, metavar="R", help="this host's rank in the job")
    p.add_argument("--nnodes", type=int, metavar="N", help="hosts the job runs on")
    p.add_argument("--flops-per-iter", type=float, metavar="F",
                   help="hint: FLOPs per iteration on this host's GPUs (W_j share)")
    p.add_argument("--compute-s", type=float, metavar="S", help="hint: compute s/iteration")
    p.add_argument("--comm-s", type=float, metavar="S", help="hint: t_j, s/iteration")
    p.add_argument("--period-s", type=float, metavar="S",
                   help="hint: iteration time alone, s (with --compute-s and --comm-s it "
                        "says how much of the compute the transfer overlaps; without it "
                        "the leader assumes half)")
    p.add_argument("--allreduce-bytes", type=float, metavar="B",
                   help="hint: gradient all-reduce size per iteration")
    p.add_argument("--tcp-port", type=int, action="append", default=[], metavar="N",
                   dest="tcp_ports",
                   help="a TCP port the job listens on at this host (repeatable, at most "
                        f"{MAX_TCP_PORTS}): the other hosts' agents probe toward it, and their "
                        "connections to it leave on the planned path. The first port given is "
                        "the one steered where the job listens on several (a decision holds "
                        "one port per job and peer): name the one its collective uses. "
                        "Ports the job listens on are also learned as it runs (the socket "
                        "interposer sees listen()); declared ones come first")
    p.add_argument("--socket", metavar="PATH",
                   help="agent socket (default: $CRUX_SOCKET, else the host's agent at "
                        "/run/crux/agent.sock, else this user's own agent's)")
    p.add_argument("--wait-s", type=float, metavar="S",
                   help="wait at most S seconds for the job's first decision before starting "
                        "it (default: the agent's [agent] start_wait_s, 2 s); 0: do not wait")
    p.add_argument("--quiet", action="store_true", help="no warnings (no agent, no library)")
    p.add_argument("--verbose", action="store_true",
                   help="say how long the job's first decision took to arrive")
    p.add_argument("--no-shim", action="store_true",
                   help="load no job-side library (neither the wrapper libibverbs, the "
                        "socket interposer nor the NCCL profiler plugin): the job is "
                        "registered but its traffic unsteered")
    p.add_argument("--no-sock", action="store_true",
                   help="leave out the socket interposer only (TCP connections unsteered)")
    p.add_argument("--no-profiler", action="store_true",
                   help="leave out the NCCL profiler plugin (t_j then comes from the NIC "
                        "counters); a profiler plugin the job names itself is kept either way")
    p.add_argument("--print-env", action="store_true",
                   help="print the exports a job needs (one `export NAME=value` per line, "
                        "POSIX shell) and exit, registering nothing: for launchers that cannot "
                        "exec through crux-run (Slurm TaskProlog, Kubernetes env, MPI)")
    p.add_argument("--table", metavar="PATH",
                   help="with --print-env: export this decision table as it is, without asking "
                        "the agent or waiting (default: the table the serving agent writes)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND")
    return p


def _check_ports(ports: list[int]) -> None:
    bad = next((p for p in ports if not 1 <= p <= 65535), None)
    if bad is not None:
        raise UsageError(f"--tcp-port must be 1..65535, got {bad}")
    if len(set(ports)) > MAX_TCP_PORTS:
        raise UsageError(f"at most {MAX_TCP_PORTS} --tcp-port, got {len(set(ports))}")
    ports[:] = dict.fromkeys(ports)  # each once, in the order given


def _local_call(args: argparse.Namespace, path: Path, body: str, msg: Message) -> Any:
    """The agent's reply body `body`, or None after one warning (fail open)."""
    from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
    from cruxd.rpc.local import LocalClient

    req = apb.LocalRequest()
    getattr(req, body).CopyFrom(msg)
    try:
        reply = LocalClient(path, timeout=3.0).call(req)
    except CruxError as exc:
        _warn(args, f"{exc}; running without crux")
        return None
    if reply.WhichOneof("body") == "error":
        _warn(args, f"the agent at {path} refused: {reply.error.message}; running without crux")
        return None
    return getattr(reply, reply.WhichOneof("body"))


def _agent(args: argparse.Namespace) -> Path | None:
    search = find_agent(args.socket)
    if search.place is None:
        _warn(args, f"{search.why_none}; running without crux")
        return None
    return search.place.socket


def _register(args: argparse.Namespace, job_id: str) -> tuple[str, float] | None:
    """The decision table's path and the agent's wait bound, or None when no agent took the
    job (fail open)."""
    from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
    from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb

    path = _agent(args)
    if path is None:
        return None
    hints = cpb.JobMeasurement(flops_per_iter=args.flops_per_iter or 0.0,
                               compute_s=args.compute_s or 0.0, comm_s=args.comm_s or 0.0,
                               period_s=args.period_s or 0.0,
                               allreduce_bytes=args.allreduce_bytes or 0.0)
    nnodes = args.nnodes or _env_int("NNODES", "SLURM_NNODES") or 1
    reg = apb.RegisterJob(
        job_id=job_id, gpus=args.gpus if args.gpus is not None else _gpus(),
        node_rank=args.node_rank if args.node_rank is not None else
        (_env_int("NODE_RANK", "SLURM_NODEID") or 0), nnodes=nnodes, hints=hints,
        command=shlex.join(args.command)[:256], tcp_ports=args.tcp_ports,
        job_key_digest=_key_digest(args, job_id))
    got = _local_call(args, path, "register", reg)
    return None if got is None else (got.decision_table, got.start_wait_s)


MAX_WAIT_S = 60.0  # agent.start_wait_s's own limit: an agent's reply cannot hold a job longer


def _wait(args: argparse.Namespace, table: str, job_id: str, agent_bound: float) -> None:
    """Wait for the job's first decision; past the bound say so once and go on (fail open)."""
    bound = agent_bound if args.wait_s is None else args.wait_s
    if not bound > 0:  # 0, or NaN from a broken reply
        return
    bound = min(bound, MAX_WAIT_S)
    w = wait_for_decision(Path(table), job_id, bound)
    if not w.found:
        _warn(args, f"no decision for job {job_id} in {table} after {bound:g} s ({w.why}); "
                    "starting it anyway: connections it makes before its decision arrives "
                    "stay unsteered")
    elif args.verbose:
        print(f"crux-run: job {job_id}'s decision (plan {w.plan_generation}) is in {table} "
              f"after {w.waited_s * 1e3:.1f} ms", file=sys.stderr)


def _key_digest(args: argparse.Namespace, job_id: str) -> str:
    """The digest of the job's key (CRUX_JOB_KEY, given to every rank by the launcher), or
    "" without one: the job is then its user's (cruxd/control/job_claims.py)."""
    from cruxd.control.job_claims import key_digest

    key = os.environ.get("CRUX_JOB_KEY", "")
    if not key:
        return ""
    try:
        return key_digest(job_id, key.encode())
    except ValueError as exc:
        _warn(args, f"CRUX_JOB_KEY: {exc}; the job registers as its user's")
        return ""


def _warn(args: argparse.Namespace, msg: str) -> None:
    if not args.quiet:
        print(f"crux-run: warning: {msg}", file=sys.stderr)


def _job_id(args: argparse.Namespace) -> str | None:
    return args.job_id or next((os.environ[n] for n in ENV_JOB if os.environ.get(n)), None)


def _print_env(args: argparse.Namespace) -> int:
    """The exports for a job this launcher cannot exec: the serving agent's real table, after
    the same bounded wait for the job's decision; nothing at all when no agent serves this
    user (an export pointing at no table would only look like crux)."""
    if args.command:
        raise UsageError("--print-env takes no COMMAND")
    job_id = _job_id(args)
    if job_id is None:
        raise UsageError("--print-env needs --job-id (or CRUX_JOB_ID, SLURM_JOB_ID, "
                         "TORCHELASTIC_RUN_ID)")
    table = args.table
    if table is None:
        from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb

        path = _agent(args)
        info = None if path is None else _local_call(args, path, "info",
                                                     apb.AgentInfoRequest(job_id=job_id))
        if info is None:
            return 0
        table = info.decision_table
        if info.job_registered:
            _wait(args, table, job_id, info.start_wait_s)
        else:
            _warn(args, f"job {job_id} is not registered with the crux agent on "
                        f"{info.host_id}, so there is no decision to wait for: its connections "
                        "are steered once a crux-run of it registers there")
    env = job_env(os.environ, job_id, table, verbs=not args.no_shim,
                  sock=not (args.no_shim or args.no_sock),
                  profiler=not (args.no_shim or args.no_profiler))
    for w in env.warnings:
        _warn(args, w)
    sys.stdout.write(render_exports(env))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]

    def go() -> int:
        if args.wait_s is not None and not 0 <= args.wait_s <= MAX_WAIT_S:
            raise UsageError(f"--wait-s must be 0..{MAX_WAIT_S:g} seconds, got {args.wait_s:g}")
        _check_ports(args.tcp_ports)
        return _print_env(args) if args.print_env else _run(args)

    return run_command("crux-run", go)


def _run(args: argparse.Namespace) -> int:
    if not args.command:
        raise UsageError("no COMMAND given (crux-run [options] -- COMMAND ...)")
    job_id = _job_id(args)
    if job_id is None:
        job_id = f"{socket.gethostname().split('.')[0]}-{os.getpid()}"
        _warn(args, f"no --job-id or CRUX_JOB_ID; using {job_id} (a job spanning several "
                    "hosts needs the same id on each)")
    env = dict(os.environ, CRUX_JOB_ID=job_id)
    taken = _register(args, job_id)
    if taken:  # only a job an agent took gets the libraries: without one, it runs untouched
        table, bound = taken
        _wait(args, table, job_id, bound)
        extra = job_env(os.environ, job_id, table, verbs=not args.no_shim,
                        sock=not (args.no_shim or args.no_sock),
                        profiler=not (args.no_shim or args.no_profiler))
        for w in extra.warnings:
            _warn(args, w)
        env.update(extra.exports)
    try:
        os.execvpe(args.command[0], args.command, env)
    except OSError as exc:
        raise NotRunnable(f"cannot run {args.command[0]!r}: {exc.strerror}") from None
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
