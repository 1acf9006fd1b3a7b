"""Scenario files: topology source + jobs + planner options, validated at the edge."""

from cruxd.scenario.load import Scenario, bundled, bundled_names, load_scenario, parse_scenario

__all__ = ["Scenario", "bundled", "bundled_names", "load_scenario", "parse_scenario"]
