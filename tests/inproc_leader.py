"""An in-process Leader on loopback with no debounce and no profiling, publishing into a
list: for tests of the planner loop's holds (test_failure_settle, test_job_settle)."""

from __future__ import annotations

from pathlib import Path

from cruxd.config.parse import parse_config
from cruxd.control.host_plans import PublishedPlan
from cruxd.leader.service import Leader


def inproc_leader(tmp_path: Path, plans: list[PublishedPlan], **leader_keys: float) -> Leader:
    """`leader_keys`: more [leader] keys (failure_settle_s, job_settle_s, ...)."""
    extra = "\n".join(f"{k} = {v}" for k, v in leader_keys.items())
    cfg = parse_config(f"""
[daemon]
roles = ["leader"]
state_dir = "{tmp_path}"
[leader]
listen = "127.0.0.1:0"
debounce_ms = 0
profiling_s = 0
{extra}
""", "<test>")
    return Leader(cfg, None, plans.append)
