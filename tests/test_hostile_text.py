"""Text from jobs, other users and hosts reaches `cruxctl`'s views made safe (issue 37, item 7):
control characters shown as `?`, rich markup escaped; counters summed over processes
saturate at the wire's uint64 instead of failing `status`."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from cruxd.cli.safe_text import plain, safe, scrub
from cruxd.cli.status_view import print_status
from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from transport.sock_records import U64_MAX, SockCounts, by_job

HOSTILE = "[/red]x\x1b]8;;http://evil\x07link\x1b]8;;\x07[link=file:///etc]y\x9b2J\u202e"


def _render(agent: apb.LocalAgentStatus | None, cluster: cpb.ClusterStatus, width: int) -> str:
    console = Console(width=width, record=True, color_system=None, emoji=False)  # as the CLI's
    print_status(console, agent and scrub(agent), scrub(cluster), 0.0)
    return console.export_text()


def test_a_hostile_job_id_and_command_are_shown_not_obeyed() -> None:
    cluster = cpb.ClusterStatus(
        leader_host="h0", levels=2, plan_generation=3, replans={HOSTILE: 2},
        agents=[cpb.AgentStatus(host_id="h0", version=HOSTILE, connected=True)],
        jobs=[cpb.JobDecision(job_id=HOSTILE, state=2, level=1, dscp=26, hosts=["h0"],
                              note=HOSTILE, routes=[cpb.PeerRoute(src_host="h0",
                                                                  peer_host=HOSTILE)])])
    agent = apb.LocalAgentStatus(host_id="h0", version="1", sock_connects=[apb.SockStatus(
        job_id=HOSTILE, processes=1, calls=3, tos_only=1)], qps=[apb.QpStatus(job_id=HOSTILE,
                                                                   peer=HOSTILE)])
    for width in (200, 80):  # the tables, and the narrow lines
        text = _render(agent, cluster, width)
        assert "[/red]x" in text and "[link=file:///etc]y" in text  # shown as written ...
        assert not any(c in text for c in "\x1b\x07\x9b\u202e")  # ... with no control
    assert cluster.jobs[0].job_id == HOSTILE  # scrub copies: --json prints the original


@given(st.text())
def test_safe_text_has_no_control_characters_and_prints(text: str) -> None:
    out = plain(text)
    assert len(out) == len(text)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in out)
    console = Console(width=120, record=True, color_system=None, emoji=False)  # as the CLI's
    console.print(safe(text))  # never a MarkupError
    printed = console.export_text()
    assert all(w in printed for w in out.split() if len(w) < 40 and not set(w) & set("[\\"))


def test_counters_summed_over_processes_saturate() -> None:
    """Two processes' records at 2^64 - 1 made the sum overflow the uint64 and `status` fail."""
    counts = {"applied": U64_MAX, "tos-only": 0, "no-job": 0, "no-table": 0, "bad-table": 0,
              "no-entry": 0, "ports-busy": U64_MAX}
    recs = [SockCounts(pid, "job", dict(counts), U64_MAX, created_ns=pid, accepts=U64_MAX)
            for pid in (10, 11)]
    (j,) = by_job(recs)
    assert j.counters["applied"] == j.calls == j.accepts == U64_MAX
    apb.SockStatus(job_id=j.job_id, processes=j.processes, calls=j.calls, accepts=j.accepts,
                   **{k.replace("-", "_"): v for k, v in j.counters.items()})  # fits the wire
