"""The host agent: local job registry, measurement and probing inputs, the link to
the leader, and the decision table the jobs' shims read."""
