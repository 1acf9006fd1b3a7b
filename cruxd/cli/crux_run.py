"""crux-run: register a job with the local crux agent, then become the job.

    crux-run [--job-id ID] [--gpus N] ... -- COMMAND [ARGS...]

    crux-run --print-env [--job-id ID]

It registers over the agent's socket and then exec()s COMMAND in its own
process, so the pid the agent watches (from SO_PEERCRED) is the job itself:
when the job ends, however it ends, the agent drops it. COMMAND gets
CRUX_JOB_ID and CRUX_DECISION_TABLE in its environment, and the job-side
libraries (cruxd/cli/job_env.py): the wrapper libibverbs for NCCL of every
generation (LD_LIBRARY_PATH and NCCL_IBVERBS_LIB) and the socket interposer
(LD_PRELOAD). Without an agent the command runs exactly as it would without
crux (fail open), after one warning, and loads none of them.

Exit status: COMMAND's; 2 for bad arguments; 127 when COMMAND cannot be run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys

from cruxd import __version__
from cruxd.cli.exits import run_command
from cruxd.cli.job_env import default_table, job_env, render_exports
from cruxd.errors import CruxError, UsageError

ENV_JOB = ("CRUX_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")


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
               "measures the job; they never set a priority. Exit status: COMMAND's; "
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
    p.add_argument("--socket", metavar="PATH",
                   help="agent socket (default: $CRUX_SOCKET, else the embedded default's)")
    p.add_argument("--quiet", action="store_true", help="no warnings (no agent, no library)")
    p.add_argument("--no-shim", action="store_true",
                   help="load no job-side library (neither the wrapper libibverbs nor the "
                        "socket interposer): the job is registered but its traffic unsteered")
    p.add_argument("--no-sock", action="store_true",
                   help="leave out the socket interposer only (TCP connections unsteered)")
    p.add_argument("--print-env", action="store_true",
                   help="print the exports a job needs (one `export NAME=value` per line, "
                        "POSIX shell) and exit, registering nothing: for launchers that cannot "
                        "exec through crux-run (Slurm TaskProlog, Kubernetes env, MPI)")
    p.add_argument("--table", metavar="PATH",
                   help="with --print-env: the decision table (default: "
                        "$CRUX_DECISION_TABLE, else the embedded default's)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND")
    return p


def _register(args: argparse.Namespace, job_id: str) -> str | None:
    """The decision table's path, or None when no agent took the job (fail open)."""
    from cruxd.cli.live_cmd import agent_socket
    from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
    from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
    from cruxd.rpc.local import LocalClient

    path = agent_socket(args.socket, None)
    hints = cpb.JobMeasurement(flops_per_iter=args.flops_per_iter or 0.0,
                               compute_s=args.compute_s or 0.0, comm_s=args.comm_s or 0.0,
                               period_s=args.period_s or 0.0,
                               allreduce_bytes=args.allreduce_bytes or 0.0)
    nnodes = args.nnodes or _env_int("NNODES", "SLURM_NNODES") or 1
    reg = apb.RegisterJob(
        job_id=job_id, gpus=args.gpus if args.gpus is not None else _gpus(),
        node_rank=args.node_rank if args.node_rank is not None else
        (_env_int("NODE_RANK", "SLURM_NODEID") or 0), nnodes=nnodes, hints=hints,
        command=shlex.join(args.command)[:256])
    try:
        reply = LocalClient(path, timeout=3.0).call(apb.LocalRequest(register=reg))
    except CruxError as exc:
        _warn(args, f"{exc}; running without crux")
        return None
    if reply.WhichOneof("body") == "error":
        _warn(args, f"the agent refused the job: {reply.error.message}; running without crux")
        return None
    return reply.registered.decision_table


def _warn(args: argparse.Namespace, msg: str) -> None:
    if not args.quiet:
        print(f"crux-run: warning: {msg}", file=sys.stderr)


def _print_env(args: argparse.Namespace) -> int:
    if args.command:
        raise UsageError("--print-env takes no COMMAND")
    job_id = args.job_id or next((os.environ[n] for n in ENV_JOB if os.environ.get(n)), None)
    if job_id is None:
        raise UsageError("--print-env needs --job-id (or CRUX_JOB_ID, SLURM_JOB_ID, "
                         "TORCHELASTIC_RUN_ID)")
    env = job_env(os.environ, job_id, args.table or default_table(),
                  verbs=not args.no_shim, sock=not (args.no_shim or args.no_sock))
    for w in env.warnings:
        _warn(args, w)
    sys.stdout.write(render_exports(env))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    return run_command("crux-run", lambda: _print_env(args) if args.print_env else _run(args))


def _run(args: argparse.Namespace) -> int:
    if not args.command:
        raise UsageError("no COMMAND given (crux-run [options] -- COMMAND ...)")
    job_id = args.job_id or next((os.environ[n] for n in ENV_JOB if os.environ.get(n)), None)
    if job_id is None:
        job_id = f"{socket.gethostname().split('.')[0]}-{os.getpid()}"
        _warn(args, f"no --job-id or CRUX_JOB_ID; using {job_id} (a job spanning several "
                    "hosts needs the same id on each)")
    env = dict(os.environ, CRUX_JOB_ID=job_id)
    table = _register(args, job_id)
    if table:  # only a job an agent took gets the libraries: without one, it runs untouched
        extra = job_env(os.environ, job_id, table, verbs=not args.no_shim,
                        sock=not (args.no_shim or args.no_sock))
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
