"""What the leader's status and hint exporters read of it: typed here, below the leader's
modules, so that neither has to import the service (or its RPC half) that calls it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from cruxd.config.model import Config
from cruxd.control.cluster import ClusterState
from cruxd.control.host_plans import LeaderPlanConfig, PublishedPlan
from cruxd.control.replan_stats import ReplanStats
from cruxd.model.topology import Topology


class LeaderView(Protocol):
    config: Config
    state: ClusterState
    plan: PublishedPlan | None
    replans: ReplanStats
    role: str
    address: str
    term: int
    active_leader: str
    not_publishing: str
    takeovers: dict[str, int]  # HA terms begun, by where the state came from
    refusals_holding: int  # agents' calls a standby holds now
    topology: Topology | None
    clock: Callable[[], float]

    def plan_config(self) -> LeaderPlanConfig: ...
