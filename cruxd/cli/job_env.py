"""The environment crux-run gives a job: its id, the decision table, and the job-side libraries.

Two ways into an NCCL job's verbs (docs/shim.md, "Loading into NCCL"):
  * NCCL <= 2.29 dlopen()s "libibverbs.so", then "libibverbs.so.1", by name. A directory whose
    libibverbs.so is the wrapper, first on LD_LIBRARY_PATH, answers the first name. It holds no
    libibverbs.so.1, so the wrapper's own dependency (and NCCL's fallback) still resolves to
    the real library.
  * NCCL >= 2.30 opens $NCCL_IBVERBS_LIB first and falls back to the names: it gets the same
    file by path.
TCP collectives get the socket interposer through LD_PRELOAD. NCCL jobs get the profiler
plugin (docs/measurement.md, "NCCL profiler plugin") as NCCL_PROFILER_PLUGIN=<its name> with its
directory on LD_LIBRARY_PATH, the one spelling NCCL 2.23 to 2.30 all accept. A job that names
its own plugin (NCCL Inspector, say) keeps it: crux's plugin chains to it
(CRUX_NCCL_PROFILER_NEXT), so both see every event. A library the install lacks is left out
with a warning: the job runs, only unsteered or unmeasured (fail open).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from transport import native

__all__ = ["JobEnv", "job_env", "render_exports"]


@dataclass
class JobEnv:
    exports: dict[str, str] = field(default_factory=dict)  # variables to set, in order
    warnings: list[str] = field(default_factory=list)


def _prepend(value: str, existing: str | None, sep: str = ":") -> str:
    parts = [p for p in (existing or "").split(sep) if p]
    return sep.join([value, *[p for p in parts if p != value]])


def job_env(base: Mapping[str, str], job_id: str, table: str | None, *, verbs: bool = True,
            sock: bool = True, profiler: bool = True) -> JobEnv:
    """What to add to `base` (the launcher's environment) for a crux job."""
    out = JobEnv()
    out.exports["CRUX_JOB_ID"] = job_id
    if table:
        out.exports["CRUX_DECISION_TABLE"] = table
    if verbs:
        try:
            wrapper = native.ibverbs_dir() / "libibverbs.so"
        except native.NativeLibraryMissing as exc:
            out.warnings.append(f"no wrapper libibverbs, RDMA runs unsteered: {exc}")
        else:
            out.exports["LD_LIBRARY_PATH"] = _prepend(str(wrapper.parent),
                                                      base.get("LD_LIBRARY_PATH"))
            out.exports["NCCL_IBVERBS_LIB"] = str(wrapper)
            tc = base.get("NCCL_IB_TC")
            if tc:
                out.warnings.append(
                    f"NCCL_IB_TC={tc} is set: crux's decided traffic class replaces it on "
                    "every QP with a decision; QPs without one keep it (cruxctl status shows "
                    "both per QP)")
    if sock:
        try:
            lib = native.library(native.SOCK)
        except native.NativeLibraryMissing as exc:
            out.warnings.append(f"no socket interposer, TCP runs unsteered: {exc}")
        else:
            # glibc splits LD_PRELOAD on spaces and colons; ours first, duplicates dropped
            existing = base.get("LD_PRELOAD", "").replace(" ", ":")
            out.exports["LD_PRELOAD"] = _prepend(str(lib), existing)
    if profiler:
        _profiler(base, out)
    return out


def _profiler(base: Mapping[str, str], out: JobEnv) -> None:
    theirs = base.get("NCCL_PROFILER_PLUGIN", "")
    if theirs.lower() == "none":  # NCCL >= 2.28: profiling switched off on purpose
        out.warnings.append("NCCL_PROFILER_PLUGIN=none is set: crux's profiler plugin is "
                            "left out, t_j comes from the NIC counters")
        return
    try:
        lib = native.library(native.NCCL_PROFILER)
    except native.NativeLibraryMissing as exc:
        out.warnings.append(f"no NCCL profiler plugin, t_j comes from the NIC counters: {exc}")
        return
    if theirs and theirs not in (lib.name, str(lib)):
        out.exports["CRUX_NCCL_PROFILER_NEXT"] = theirs
        out.warnings.append(f"NCCL_PROFILER_PLUGIN={theirs} is set: crux's plugin loads it and "
                            "forwards every event to it (chained), so both profile the job")
    out.exports["NCCL_PROFILER_PLUGIN"] = lib.name
    path = out.exports.get("LD_LIBRARY_PATH", base.get("LD_LIBRARY_PATH", ""))
    parts = [p for p in path.split(":") if p]
    if str(lib.parent) not in parts:  # after the wrapper's directory, which must stay first
        parts.insert(1 if "LD_LIBRARY_PATH" in out.exports else 0, str(lib.parent))
    out.exports["LD_LIBRARY_PATH"] = ":".join(parts)


def render_exports(env: JobEnv) -> str:
    """POSIX shell: one `export NAME=value` per line (Slurm TaskProlog reads the same)."""
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.exports.items())
