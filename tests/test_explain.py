"""`cruxctl status JOB` (cruxd/cli/explain.py): a job's level and why, from status and plan."""

from __future__ import annotations

from typing import Any

import pytest

from cruxd.cli.explain import explain, lines


def status() -> dict[str, Any]:
    def job(jid: str, state: str, level: int, rank: int, intensity: float | None) -> dict[str, Any]:
        return {"job_id": jid, "state": state, "note": "", "level": level, "dscp": 8 * level,
                "rank": rank, "intensity": intensity, "k": 1.0, "hosts": ["h0", "h1"],
                "routes": [{"src_host": "h0", "peer_host": "h1", "sport": 49153,
                            "hops": ["leaf0", "spine1"], "tcp_dport": 29500,
                            "tcp_sports": [40001, 40002]}],
                "qps_applied": 8, "qps_total": 8, "decision_changes": 1, "tcp_ports_busy": 0,
                "measurement": {"flops_per_iter": 4e15, "comm_s": 0.2, "period_s": 0.5,
                                "source": "nvml+nccl"}}
    return {"levels": 4, "jobs": [job("gpt", "scheduled", 3, 0, 2e16),
                                  job("bert", "scheduled", 1, 1, 5e15),
                                  job("resnet", "scheduled", 1, 2, 1e15),
                                  job("solo", "scheduled", 3, 3, None)]}


def plan() -> dict[str, Any]:
    def d(job: str, rank: int, level: int, intensity: float | None) -> dict[str, Any]:
        return {"job": job, "intensity": intensity, "priority": intensity, "rank": rank,
                "level": level, "k": 1.0}
    return {"jobs": [d("gpt", 0, 3, 2e16), d("bert", 1, 1, 5e15), d("resnet", 2, 1, 1e15),
                     d("solo", 3, 3, None)],
            "links": [{"link": "leaf0->spine1", "jobs": ["gpt", "bert"]},
                      {"link": "spine1->leaf1", "jobs": ["gpt", "bert", "resnet"]}]}


def test_a_job_between_others_says_whom_it_yields_to_and_why() -> None:
    e = explain("bert", status(), plan())
    assert [o["job_id"] for o in e["yields_to"]] == ["gpt"]
    assert e["yields_to"][0]["links"] == ["leaf0->spine1", "spine1->leaf1"]
    assert [o["job_id"] for o in e["ahead_of"]] == ["resnet"]
    text = "\n".join(lines(e))
    assert "job bert: scheduled, level 1 of 4 (DSCP 8), rank 1" in text
    assert "I_j = W_j / t_j = 4e+15 FLOP / 0.2 s from nvml+nccl = 5e+15 FLOP/s" in text
    assert "yields to gpt (I_j 2e+16, P_j 2e+16, level 3) on leaf0->spine1, spine1->leaf1" in text
    assert "is ahead of resnet" in text
    assert "path h0->h1: UDP sport 49153 via leaf0>spine1; TCP to port 29500 from 2" in text
    assert "applied: 8/8 QPs applied; decision changed 1 time(s)" in text


def test_network_free_profiling_and_unknown_plans_are_said_plainly() -> None:
    text = "\n".join(lines(explain("solo", status(), plan())))
    assert "infinite" in text and "shares no link with another job" in text
    st = status()
    st["jobs"][0]["state"] = "profiling"
    assert "alone at the top level" in "\n".join(lines(explain("gpt", st, None)))
    assert "unknown until the leader's next plan" in "\n".join(lines(explain("gpt", st, None)))
    with pytest.raises(KeyError):
        explain("nope", status(), plan())
