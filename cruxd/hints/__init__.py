"""Placement hints for topology-aware job schedulers (leader side, pure)."""
