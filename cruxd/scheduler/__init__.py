"""The scheduler core (pure): intensity, path selection, priorities, compression.

`plan` and `PlanConfig` load lazily: agent-only hosts import small pieces of this
package (the DSCP map) and should not pay for numpy and scipy.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PlanConfig", "plan"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from cruxd.scheduler import planner

        return getattr(planner, name)
    raise AttributeError(f"module 'cruxd.scheduler' has no attribute {name!r}")
