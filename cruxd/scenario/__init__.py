"""Scenario files: topology source + jobs + planner options, validated at the edge.

The names below load cruxd.scenario.load (and the scheduler behind it) on first use, not
when the package is imported: `cruxctl jobs` and `status` import parts of it and must stay
quick (docs/control-plane.md, "cruxctl").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Scenario", "bundled", "bundled_names", "load_scenario", "parse_scenario"]

if TYPE_CHECKING:
    from cruxd.scenario.load import (
        Scenario,
        bundled,
        bundled_names,
        load_scenario,
        parse_scenario,
    )


def __getattr__(name: str) -> Any:
    if name in __all__:
        from cruxd.scenario import load

        return getattr(load, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
