"""The optional extras, and one line naming the extra when a role or command needs one.

An agent host installs `crux` alone: numpy, gRPC, NVML, Prometheus and rich. What only some
hosts run comes as an extra (pyproject.toml), so 10,000 agents do not carry a MIP solver:

    crux[leader]  scipy (HiGHS, sparse graphs: the scheduler), grpcio-reflection
    crux[ha]      aetcd: [leader] ha = "etcd", on the leaders and on the agents that follow
    crux[plot]    matplotlib: cruxctl simulate --plot

Kept free of imports beyond the standard library: crux-run and cruxctl load it on every call.
"""

from __future__ import annotations

import importlib

from cruxd.errors import MissingExtra

# the top-level module each extra brings, and the extra to install for it
EXTRA_OF = {"scipy": "leader", "grpc_reflection": "leader", "aetcd": "ha",
            "matplotlib": "plot"}


def require(module: str, what: str) -> None:
    """Import `module` (an extra's); MissingExtra saying `what` needs which extra unless it
    loads. An import, not a lookup: a broken install fails here, not minutes later."""
    try:
        importlib.import_module(module)
    except ImportError as exc:  # missing, or broken (its message may span lines)
        raise _missing(module, (str(exc).splitlines() or ["cannot import it"])[0],
                       what) from None


def missing_extra(exc: ImportError) -> MissingExtra | None:
    """The one-line error for an import of an extra's module that failed deep in a command,
    or None when `exc` is about something else (a real bug: keep its traceback)."""
    module = (exc.name or "").split(".")[0]
    if module not in EXTRA_OF:
        return None
    return _missing(module, f"{module} is not installed", "this command")


def _missing(module: str, why: str, what: str) -> MissingExtra:
    extra = EXTRA_OF[module]
    return MissingExtra(f"{what} needs crux[{extra}] ({why}): pip install 'crux[{extra}]'")
