"""Topology sources: builders for the seed's fabrics and the Lingjun production data."""

from cruxd.topo.builders import BUILDERS, clos2, double_sided, testbed96, trace_clos
from cruxd.topo.lingjun import lingjun

__all__ = ["BUILDERS", "clos2", "double_sided", "lingjun", "testbed96", "trace_clos"]
