"""The scheduler core (pure): intensity, path selection, priorities, compression."""

from cruxd.scheduler.planner import PlanConfig, plan

__all__ = ["PlanConfig", "plan"]
