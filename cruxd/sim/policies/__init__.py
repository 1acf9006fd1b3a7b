"""Scheduling policies for the simulator, by name."""

from __future__ import annotations

from collections.abc import Callable

from cruxd.sim.policies.base import Context, Decisions, Policy
from cruxd.sim.policies.cassini import Cassini
from cruxd.sim.policies.crux import crux_fair, crux_full, crux_pa, crux_ps_pa
from cruxd.sim.policies.ecmp import Ecmp
from cruxd.sim.policies.fixed import Fixed
from cruxd.sim.policies.sincronia import Sincronia
from cruxd.sim.policies.spray import Spray, SprayCruxPa
from cruxd.sim.policies.taccl import Taccl

POLICIES: dict[str, Callable[[], Policy]] = {
    "ecmp": Ecmp,
    "crux-pa": crux_pa,
    "crux-ps-pa": crux_ps_pa,
    "crux-full": crux_full,
    "crux-fair": crux_fair,
    "sincronia": Sincronia,
    "taccl*": Taccl,
    "cassini": Cassini,
    "spray": Spray,
    "spray+crux-pa": SprayCruxPa,
}


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None


__all__ = ["POLICIES", "Context", "Decisions", "Fixed", "Policy", "make_policy"]
