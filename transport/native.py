"""Where the installed C libraries are: transport/native/, filled by the build (setup.py).

    libcrux_pcie.so        PCIe semaphores (transport/pcie.py, the wrapper's gating)
    libcrux_sampler.so     the agent's NIC counter loop (cruxd/measure/sampling/csampler.py)
    libcrux_rates.so       the trace simulator's rate solver (cruxd/sim/rates.py)
    libcrux_nccl_profiler.so  the NCCL profiler plugin (NCCL_PROFILER_PLUGIN; crux-run)
    libcrux_ibverbs.so     the wrapper libibverbs, for LD_PRELOAD and NCCL_IBVERBS_LIB
    ibverbs/libibverbs.so  the same wrapper under the name NCCL <= 2.29 dlopen()s: crux-run
                           puts this directory first on the job's LD_LIBRARY_PATH

`pip install` (wheel, sdist or editable) compiles them; nothing is compiled at run time. A
library that is missing raises NativeLibraryMissing naming the file and the fix.
$CRUX_LIB_DIR points everything at another directory of the same layout (a packaged
/usr/lib/crux, say).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["LIB_DIR_ENV", "NativeLibraryMissing", "ibverbs_dir", "lib_dir", "library"]

LIB_DIR_ENV = "CRUX_LIB_DIR"
PCIE = "libcrux_pcie.so"
SAMPLER = "libcrux_sampler.so"
IBVERBS = "libcrux_ibverbs.so"
SOCK = "libcrux_sock.so"
RATES = "libcrux_rates.so"
NCCL_PROFILER = "libcrux_nccl_profiler.so"


class NativeLibraryMissing(FileNotFoundError):
    """An installed C library is not where the install put it (or $CRUX_LIB_DIR says).
    An OSError, so callers that fail open on OS errors fail open on this too."""


def lib_dir() -> Path:
    env = os.environ.get(LIB_DIR_ENV)
    return Path(env) if env else Path(__file__).resolve().parent / "native"


def library(name: str) -> Path:
    """The path of an installed library (`libcrux_pcie.so`, ...), or NativeLibraryMissing."""
    path = lib_dir() / name
    if not path.is_file():
        how = (f"${LIB_DIR_ENV} is {os.environ[LIB_DIR_ENV]}" if os.environ.get(LIB_DIR_ENV)
               else "reinstall crux (pip install ., which compiles shim/), or in a checkout "
                    "run `python setup.py build_ext --inplace`")
        raise NativeLibraryMissing(f"{path} is missing: {how}")
    return path


def ibverbs_dir() -> Path:
    """The directory whose libibverbs.so is the wrapper (first on a job's LD_LIBRARY_PATH)."""
    d = lib_dir() / "ibverbs"
    library("ibverbs/libibverbs.so")
    return d
