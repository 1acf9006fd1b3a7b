"""The environment crux-run gives a job: its id, the decision table, and the job-side libraries.

Two ways into an NCCL job's verbs (docs/shim.md, "Loading into NCCL"):
  * NCCL <= 2.29 dlopen()s "libibverbs.so", then "libibverbs.so.1", by name. A directory whose
    libibverbs.so is the wrapper, first on LD_LIBRARY_PATH, answers the first name. It holds no
    libibverbs.so.1, so the wrapper's own dependency (and NCCL's fallback) still resolves to
    the real library.
  * NCCL >= 2.30 opens $NCCL_IBVERBS_LIB first and falls back to the names: it gets the same
    file by path.
TCP collectives get the socket interposer through LD_PRELOAD. A library the install lacks is
left out with a warning: the job runs, only unsteered (fail open).
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
            sock: bool = True) -> JobEnv:
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
    return out


def render_exports(env: JobEnv) -> str:
    """POSIX shell: one `export NAME=value` per line (Slurm TaskProlog reads the same)."""
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.exports.items())
