"""Levels -> DSCP values, on the fabric's lossless classes, and which level a job outside
the scheduler's plan gets.

Switches and NICs offer 8 priorities, typically trusted from DSCP as priority =
DSCP >> 3. A RoCE fabric is lossless (PFC) on some of them only: on a stock one,
priority 3 alone, where NVIDIA's default configuration puts RoCE at DSCP 26.
crux's levels must stay on lossless priorities, one priority per level (two DSCP
values of one priority share its queue), so the fabric's lossless priorities bound
the levels (docs/operations.md has the recipes):

* lossless priorities not declared, and no levels or DSCP configured: the stock
  fabric, priority 3, one level on DSCP 26 (crux decides paths only);
* lossless priorities declared: by default one level per priority, lowest first, on
  DSCP 8p + 2 (AF p1: 26 for priority 3, 34 for 4, 18 for 2); configured DSCP values
  must map to distinct lossless priorities;
* declared empty (lossy RoCE, 8 classes): levels on the class selectors as below.

Without PFC, some priorities are not ours to use (seed §4.3): by default priority 0
stays best effort (TCP, storage), 6 carries control traffic (crux's own RPCs, CNPs)
and 7 diagnosis/probing. Job levels take the highest unreserved priorities, level 0
on the lowest of them: with 5 levels, levels 0..4 are CS1..CS5 (DSCP 8, 16, 24, 32, 40).

A job in its profiling window gets the top level alone (seed §5), so the scheduler
plans everybody else onto the levels below; a job it cannot plan yet (no
measurements) sits on the lowest level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_RESERVED = (0, 6, 7)
DEFAULT_LEVELS = 5


STOCK_LOSSLESS = (3,)  # PFC on priority 3 alone: RoCE's usual lossless class


@dataclass(frozen=True)
class FabricLevels:
    """The levels resolved against the fabric's lossless priorities (`fabric_levels`)."""

    levels: int
    dscp: tuple[int, ...]  # per level, lowest first
    lossless: tuple[int, ...]  # the lossless priorities; () lossy RoCE
    declared: bool  # False: levels or DSCP given without lossless priorities (unchecked)


def lossless_dscp(priorities: Sequence[int]) -> tuple[int, ...]:
    """The default DSCP of each priority, lowest first: AF p1 (8p + 2), the class NVIDIA's
    default configuration gives RoCE on priority 3 (DSCP 26)."""
    return tuple(8 * p + 2 for p in sorted(priorities))


def fabric_levels(levels: int | None, dscp: Sequence[int] | None,
                  lossless: Sequence[int] | None) -> FabricLevels:
    """The levels and their DSCP for a fabric lossless on `lossless` (None: not declared;
    (): lossy). ValueError says why the combination cannot work."""
    if lossless is None:
        if levels is None and not dscp:  # nothing configured: the stock fabric
            return FabricLevels(1, lossless_dscp(STOCK_LOSSLESS), STOCK_LOSSLESS, True)
        n = levels if levels is not None else len(dscp) if dscp else DEFAULT_LEVELS
        return FabricLevels(n, level_dscp(n, dscp or None), (), False)
    check_priorities(lossless)
    if not lossless:
        n = levels if levels is not None else len(dscp) if dscp else DEFAULT_LEVELS
        return FabricLevels(n, level_dscp(n, dscp or None), (), True)
    pfc = tuple(sorted(lossless))
    n = levels if levels is not None else len(dscp) if dscp else len(pfc)
    if not dscp and n > len(pfc):
        raise ValueError(f"{n} levels need {n} lossless priorities, and PFC is on "
                         f"{len(pfc)} ({_names(pfc)}): declare more lossless priorities, "
                         f"fewer levels, or lossless_priorities = [] for lossy RoCE")
    values = check_dscp(dscp, n) if dscp else lossless_dscp(pfc[:n])
    lossy = [(v, v >> 3) for v in values if v >> 3 not in pfc]
    if lossy:
        v, p = lossy[0]
        raise ValueError(f"DSCP {v} is priority {p}, which is not lossless (PFC on "
                         f"{_names(pfc)}): RoCE on that level would be dropped under "
                         f"congestion; use DSCP {', '.join(map(str, lossless_dscp(pfc)))}, "
                         f"or declare priority {p} lossless")
    by_prio: dict[int, int] = {}
    for v in values:
        if (w := by_prio.setdefault(v >> 3, v)) != v:
            raise ValueError(f"DSCP {w} and {v} are both priority {v >> 3}: two levels would "
                             "share its queue")
    return FabricLevels(n, values, pfc, True)


def check_priorities(priorities: Sequence[int]) -> None:
    bad = [p for p in priorities if not (isinstance(p, int) and 0 <= p <= 7)]
    if bad:
        raise ValueError(f"priorities are integers 0..7, got {bad[0]!r}")
    if len(set(priorities)) != len(priorities):
        raise ValueError("priorities must be distinct")


def _names(prios: tuple[int, ...]) -> str:
    return "priority " + ", ".join(map(str, prios)) if len(prios) == 1 else \
        "priorities " + ", ".join(map(str, prios))


def default_dscp(levels: int, reserved: Sequence[int] = DEFAULT_RESERVED) -> tuple[int, ...]:
    free = [p for p in range(8) if p not in set(reserved)]
    if not 1 <= levels <= len(free):
        raise ValueError(f"{levels} levels do not fit the {len(free)} unreserved priorities "
                         f"(reserved: {', '.join(map(str, reserved)) or 'none'}); "
                         f"give explicit DSCP values per level")
    return tuple(8 * p for p in free[len(free) - levels:])


def check_dscp(values: Sequence[int], levels: int) -> tuple[int, ...]:
    if len(values) != levels:
        raise ValueError(f"need one DSCP value per level: {levels} levels, {len(values)} values")
    for v in values:
        if not (isinstance(v, int) and 0 <= v <= 63):
            raise ValueError(f"DSCP values are integers 0..63, got {v!r}")
    if len(set(values)) != len(values):
        raise ValueError("DSCP values must be distinct: two levels would share a queue")
    return tuple(values)


def level_dscp(levels: int, dscp: Sequence[int] | None = None) -> tuple[int, ...]:
    """The DSCP of each level, lowest first: `dscp` checked when given, else the default
    map. ValueError says why the pair cannot work."""
    return default_dscp(levels) if dscp is None else check_dscp(dscp, levels)


def can_profile(levels: int) -> bool:
    """Whether jobs get a profiling window: it takes the top level alone, so at least one
    level must remain for everybody else."""
    return levels >= 2


def scheduled_dscp(dscp: tuple[int, ...], profiling: bool) -> tuple[int, ...]:
    """The levels (their DSCPs) left to the scheduler: all, or all but the top one while
    a job profiles on it."""
    return dscp[:-1] if profiling and can_profile(len(dscp)) else dscp


def profiling_slot(dscp: Sequence[int]) -> tuple[int, int]:
    """(level, DSCP) of a job in its profiling window: the top level."""
    return len(dscp) - 1, dscp[-1]


def unmeasured_slot(dscp: Sequence[int]) -> tuple[int, int]:
    """(level, DSCP) of a job the scheduler cannot plan yet: the lowest level."""
    return 0, dscp[0]
