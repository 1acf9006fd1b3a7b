"""Build the shim's C benchmark programs on first use (`make -C shim <target>`).

Only benchmarks use this: the libraries the daemon and jobs load are compiled by the install
(setup.py build_ext, transport/native.py), never at run time. Concurrent callers build
once: the make runs under an flock in shim/build/.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

SHIM = Path(__file__).resolve().parent.parent / "shim"
BUILD = SHIM / "build"


class ShimBuildError(RuntimeError):
    """The artifact is missing and could not be built here; the message says why."""


def ensure_built(artifact: Path, target: str) -> Path:
    """`artifact`, after `make <target>` has brought it up to date with its sources. Without
    make or a compiler an existing artifact is used as it is."""
    make, cc = shutil.which("make"), shutil.which(os.environ.get("CC", "gcc"))
    if make is None or cc is None or not (SHIM / "Makefile").exists():
        if artifact.exists():
            return artifact
        raise ShimBuildError(f"{artifact} is missing and cannot be built here "
                             f"(needs make and a C compiler: run `make -C {SHIM} {target}`)")
    BUILD.mkdir(exist_ok=True)
    with open(BUILD / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run = subprocess.run([make, "-s", "-C", str(SHIM), target], capture_output=True,
                             text=True, check=False)
        if run.returncode != 0 or not artifact.exists():
            raise ShimBuildError(f"`make -C {SHIM} {target}` failed: "
                                 f"{(run.stderr or run.stdout).strip()}")
    return artifact
