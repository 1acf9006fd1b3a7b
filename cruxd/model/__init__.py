"""The domain model: pure dataclasses, no I/O."""

from cruxd.model.jobs import FlowSpec, Job, ring_allreduce
from cruxd.model.paths import PathFinder
from cruxd.model.plan import FlowDecision, JobDecision, LinkLoad, Plan
from cruxd.model.topology import Link, Node, NodeKind, Topology, TopologyBuilder
from cruxd.model.view import ClusterView, DiscoveredPath

__all__ = [
    "ClusterView", "DiscoveredPath", "FlowDecision", "FlowSpec", "Job", "JobDecision", "Link",
    "LinkLoad", "Node", "NodeKind", "PathFinder", "Plan", "Topology", "TopologyBuilder",
    "ring_allreduce",
]
