"""The leader: ingests agents' reports, re-plans on change, streams plans, persists."""
