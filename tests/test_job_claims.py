"""Which parts of a job id are one job (cruxd/control/job_claims.py; issue 37, item 4): a
user on another host who names a running job is left out of it, counted and shown, and gets
none of its decisions.

Pure: the claim, the digest, the split (fixed cases and hypothesis), the leader's merge. On
real processes: a leader and three agents over gRPC on loopback, crux-run on each, the part
on the third host registered with another job key; and `nobody` (setpriv) naming root's job
from another host.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cruxd.control.cluster import ClusterState
from cruxd.control.job_claims import claim_of, key_digest, public, split, valid_claim
from cruxd.control.records import AgentReport, HostInventory, LocalJob, Measurement
from cruxd.control.validate import InvalidMessage, check_local_job

KEY = b"0123456789abcdef-the-victims-key"
DIGEST = key_digest("victim", KEY)
MEASURED = Measurement(flops_per_iter=2e15, comm_s=0.01, period_s=0.1, compute_s=0.09,
                       source="nvml+nic")
DECLARED = Measurement(flops_per_iter=1.0, comm_s=1e6, period_s=1e6, compute_s=1.0,
                       source="hints")


def part(claim: str, registered: int, m: Measurement = MEASURED, rank: int = 0) -> LocalJob:
    return LocalJob("victim", 8, rank, 2, registered, m, claim=claim)


def test_the_digest_is_bound_to_the_job_and_the_key() -> None:
    assert len(DIGEST) == 32 and valid_claim(claim_of(DIGEST, 0))
    assert key_digest("victim", KEY) == DIGEST  # every rank computes the same
    assert key_digest("other", KEY) != DIGEST
    assert key_digest("victim", KEY + b"!") != DIGEST
    with pytest.raises(ValueError, match="16 to 4096 bytes"):
        key_digest("victim", b"short")
    assert claim_of("", 1000) == "uid:1000" and public(claim_of(DIGEST, 0)) == "key"
    assert public("uid:7") == "uid:7"


@pytest.mark.parametrize("claim", ["uid:", "uid:01", "uid:-1", "uid:12345678901",
                                   "key:" + "0" * 31, "key:" + "G" * 32, "key:" + "0" * 33,
                                   "root", "uid:0 ", "key:" + DIGEST.upper()])
def test_a_malformed_claim_is_refused_at_the_edge(claim: str) -> None:
    with pytest.raises(InvalidMessage, match=r"job\.claim"):
        check_local_job(part(claim, 1))


def test_the_part_registered_first_decides_and_the_others_are_left_out() -> None:
    a, b = ("A", part("uid:1000", 100)), ("B", part("uid:1000", 120, rank=1))
    c = ("C", part("uid:1001", 500, DECLARED))
    kept, refused = split([a, b, c])
    assert kept == (a, b)
    assert [(r.host, r.reason) for r in refused] == [
        ("C", "claims uid:1001, the job is uid:1000's (registered first, on A)")]
    # a squatter who registered first keeps the id: the latecomers are left out
    kept, refused = split([("C", part("uid:1001", 50)), a, b])
    assert [h for h, _ in kept] == ["C"] and {r.host for r in refused} == {"A", "B"}
    # a key's digest never shows in the reason
    kept, refused = split([("A", part(claim_of(DIGEST, 0), 1)), ("C", part("uid:0", 2))])
    assert DIGEST not in refused[0].reason and "the job is key's" in refused[0].reason
    # parts from agents before claims merge with anything
    assert split([a, ("D", part("", 0))]) == ((a, ("D", part("", 0))), ())


claims = st.sampled_from(["", "uid:0", "uid:1000", claim_of(DIGEST, 0)])


@given(st.lists(st.tuples(st.sampled_from("ABCDEF"), claims, st.integers(0, 5)),
                min_size=1, max_size=8, unique_by=lambda t: t[0]))
def test_kept_parts_claim_alike_and_the_first_claimed_part_is_kept(
        raw: list[tuple[str, str, int]]) -> None:
    members = [(h, part(c, t)) for h, c, t in raw]
    kept, refused = split(members)
    assert sorted([h for h, _ in kept] + [r.host for r in refused]) == \
        sorted(h for h, _ in members)
    assert len({j.claim for _, j in kept} - {""}) <= 1
    claimed = [(j.registered_unix_ms, h) for h, j in members if j.claim]
    if claimed:
        assert min(claimed)[1] in {h for h, _ in kept}


def report(host: str, *jobs: LocalJob) -> AgentReport:
    return AgentReport(HostInventory(host, "test", 8, ()), jobs, (), (), 0)


def test_the_leader_merges_only_the_job_and_counts_the_refusal_once() -> None:
    state = ClusterState(agent_timeout_s=30, change_threshold=0.1, profiling_s=0)
    state.ingest(report("A", part("uid:1000", 100)), 0.0)
    state.ingest(report("B", part("uid:1000", 120, rank=1)), 0.0)
    (alone,) = state.merged_jobs()
    state.ingest(report("C", part("uid:1001", 500, DECLARED)), 1.0)
    for _ in range(3):  # merged on every plan and every status: counted once
        (merged,) = state.merged_jobs()
    assert merged == alone  # C's declared t_j = 1e6 s did not reach the job
    assert [h for h, _ in merged.hosts] == ["A", "B"]
    assert state.claims_refused_total == 1
    assert [r.host for r in state.refused["victim"]] == ["C"]
    state.ingest(report("C"), 2.0)  # the squatter leaves
    state.merged_jobs()
    assert state.refused == {} and state.claims_refused_total == 1


# --- on real processes ---------------------------------------------------------------------


def _table_jobs(path: Path) -> set[str]:
    """The jobs in a host's decision table; none before its agent made the table."""
    from transport.decision_table import TableError, TableReader

    try:
        with TableReader(path) as reader:
            return {e.job_id for e in reader.snapshot()}
    except TableError:
        return set()


def test_a_part_with_another_key_gets_none_of_the_jobs_decisions(tmp_path: Path) -> None:
    from cruxd.testing import BIN, Daemon, free_port, running, spawn, status, wait_for

    listen = f"127.0.0.1:{free_port()}"
    leader = Daemon(tmp_path, "lead", {"daemon": {"roles": ["leader"]},
                                       "leader": {"listen": listen, "profiling_s": 0,
                                                  "debounce_ms": 10}})
    token = str(leader.root / "state" / "leader.token")
    agents = [Daemon(tmp_path, h, {"daemon": {"roles": ["agent"]},
                                   "agent": {"leader": listen, "leader_token": token,
                                             "probing": "none", "gpus": 8,
                                             "addresses": [f"10.88.0.{i + 1}"]}})
              for i, h in enumerate(("h1", "h2", "h3"))]
    leader.start()
    leader.wait_log("leader listening on")
    with running(agents, "leader") as jobs:
        figures = ["--flops-per-iter", "1e15", "--compute-s", "0.09", "--period-s", "0.1"]
        for rank, (agent, key, comm) in enumerate(((agents[0], KEY, "0.01"),
                                                   (agents[1], KEY, "0.01"),
                                                   (agents[2], b"another-key-of-16-bytes", "1e6"))):
            jobs.append(spawn([str(BIN / "crux-run"), "--socket", str(agent.socket),
                               "--job-id", "victim", "--nnodes", "2",
                               "--node-rank", str(min(rank, 1)), "--comm-s", comm, *figures,
                               "--", "sleep", "600"], env={"CRUX_JOB_KEY": key.decode()}))
            if rank == 1:  # the squatter comes later: the job's claim is the first part's
                wait_for("the victim's decisions on h1",
                         lambda: "victim" in _table_jobs(agents[0].table), timeout=30)

        def refused() -> dict[str, object] | None:
            cluster = status(agents[0].socket).get("cluster") or {}
            return cluster if cluster.get("refused_claims") else None

        cluster = wait_for("the part on h3 left out", refused, timeout=30)
        (refusal,) = cluster["refused_claims"]
        assert (refusal["job_id"], refusal["host_id"]) == ("victim", "h3")
        # h1 and h2 start together, so either may be the first (their claims are the same)
        assert refusal["reason"] in (f"claims key, the job is key's (registered first, on {h})"
                                     for h in ("h1", "h2"))
        assert cluster["claims_refused_total"] == 1
        (victim,) = [j for j in cluster["jobs"] if j["job_id"] == "victim"]
        assert victim["measurement"]["comm_s"] == pytest.approx(0.01)  # not h3's 1e6
        wait_for("the victim's decisions on h2",
                 lambda: "victim" in _table_jobs(agents[1].table), timeout=30)
        assert "victim" not in _table_jobs(agents[2].table)  # h3 got none of its decisions
        local = json.loads(spawn_cruxctl_jobs(agents[2].socket))
        assert [j["claim"] for j in local["jobs"]] == ["key"]  # no digest for local clients
    leader.stop()


def spawn_cruxctl_jobs(socket_path: Path) -> str:
    from cruxd.testing import cruxctl

    r = cruxctl("jobs", "--json", socket_path=socket_path)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.root
def test_another_users_part_is_left_out(tmp_path: Path) -> None:
    """The attack as the issue ran it: on host h0 `nobody` runs crux-run naming a job root
    runs on h1, with declared t_j = 1e6 s. h0's agent runs as cruxd.service starts it
    (tests/rig/system_host.py) and sees nobody's uid from SO_PEERCRED."""
    from cruxd.testing import BIN, Daemon, crux_run, free_port, status, toml, wait_for
    from tests.rig.system_host import NOBODY, RUN, SystemHost, can_run_as

    if os.geteuid() != 0:
        pytest.skip("needs root (setpriv, a private mount namespace)")
    if (why := can_run_as(NOBODY)) is not None:
        pytest.skip(why)
    listen = f"127.0.0.1:{free_port()}"
    leader = Daemon(tmp_path, "lead", {"daemon": {"roles": ["leader"]},
                                       "leader": {"listen": listen, "profiling_s": 0,
                                                  "debounce_ms": 10}}).start()
    leader.wait_log("leader listening on")
    token = str(leader.root / "state" / "leader.token")
    agent = {"leader": listen, "leader_token": token, "probing": "none", "gpus": 8}
    h1 = Daemon(tmp_path, "h1", {"daemon": {"roles": ["agent"]},
                                 "agent": {**agent, "addresses": ["10.88.1.1"]}}).start()
    h1.wait_log("agent h1")
    config = tmp_path / "h0.toml"
    config.write_text(toml({"daemon": {"roles": ["agent"], "host_id": "h0"},
                            "agent": {**agent, "addresses": ["10.88.1.2"]},
                            "metrics": {"listen": ""}}))
    jobs = []
    try:
        with SystemHost() as h:
            h0 = h.cruxd(config, tmp_path / "h0.log", state_dir=tmp_path / "h0-state")
            wait_for("h0's agent", lambda: h.path(RUN / "agent.sock").is_socket()
                     or h0.poll() is not None)
            jobs.append(crux_run(h1.socket, "victim", "--nnodes", "2", "--node-rank", "0",
                                 "--flops-per-iter", "1e15", "--comm-s", "0.01"))
            wait_for("the victim's decisions on h1",
                     lambda: "victim" in _table_jobs(h1.table), timeout=30)
            squat = h.as_user([str(BIN / "crux-run"), "--job-id", "victim", "--nnodes", "2",
                               "--node-rank", "1", "--flops-per-iter", "1", "--comm-s", "1e6",
                               "--wait-s", "0", "--", "sleep", "30"], in_group=True)
            try:
                def refused() -> list[dict[str, str]] | None:
                    cluster = status(h1.socket).get("cluster") or {}
                    return cluster.get("refused_claims") or None

                got = wait_for("nobody's part left out", refused, timeout=30)
                assert got == [{"job_id": "victim", "host_id": "h0",
                                "reason": "claims uid:65534, the job is uid:0's "
                                          "(registered first, on h1)"}]
                cluster = status(h1.socket)["cluster"]
                (victim,) = [j for j in cluster["jobs"] if j["job_id"] == "victim"]
                assert victim["measurement"]["comm_s"] == pytest.approx(0.01)
                assert "victim" not in _table_jobs(h.path(RUN / "decisions"))
            finally:
                squat.kill()
                squat.wait()
                h0.terminate()
                h0.wait(20)
    finally:
        for j in jobs:
            j.kill()
            j.wait()
        h1.stop()
        leader.stop()
