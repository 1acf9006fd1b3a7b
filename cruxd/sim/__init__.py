"""The fabric simulator: iterative jobs on a flow-level fluid network (pure)."""
