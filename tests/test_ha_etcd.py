"""The HA leader on a real 3-member etcd cluster (Debian's etcd-server) on loopback: three
cruxd leader candidates, four agents, jobs registered through crux-run.

Failover times are measured and printed, not bounded here: bench/ha.py bounds them over
20 kills. What is asserted is what HA guarantees (docs/control-plane.md): one active
leader, the same generation after a failover, no decision changed by it, nothing applied
from a deposed leader, planning through the loss of one member, none without quorum.
"""

from __future__ import annotations

import re
import secrets
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb
from cruxd.rpc.gen.crux.v1 import leader_pb2_grpc as lgrpc
from cruxd.rpc.local import LocalClient
from cruxd.testing import Daemon, crux_run, free_port, wait_for
from cruxd.testing.etcd_rig import EtcdCluster, etcd_missing
from transport.decision_table import TableReader

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(etcd_missing() is not None, reason=etcd_missing() or "")]
LEASE_S = 2


@dataclass
class Rig:
    root: Path
    etcd: EtcdCluster
    token: str
    leaders: list[Daemon] = field(default_factory=list)
    agents: list[Daemon] = field(default_factory=list)
    addresses: dict[str, str] = field(default_factory=dict)  # leader name -> host:port
    errors: list[str] = field(default_factory=list)  # failed Status calls, for failures

    def status(self, d: Daemon) -> cpb.ClusterStatus | None:
        with grpc.insecure_channel(self.addresses[d.name]) as ch:
            stub = lgrpc.LeaderStub(ch)  # type: ignore[no-untyped-call]
            try:
                return stub.Status(lpb.StatusRequest(), timeout=2,
                                   metadata=(("authorization", f"Bearer {self.token}"),))
            except grpc.RpcError as exc:
                self.errors.append(f"{d.name}: {exc}")
                return None

    def active(self, among: list[Daemon] | None = None) -> Daemon | None:
        found = [d for d in among or self.leaders
                 if d.proc is not None and (s := self.status(d)) and s.ha_role == "active"]
        assert len(found) <= 1, [d.name for d in found]
        return found[0] if found else None

    def tables(self) -> dict[str, set[tuple[object, ...]]]:
        """Every agent's decisions, without the generation that made them."""
        out = {}
        for a in self.agents:
            with TableReader(a.table) as t:
                out[a.name] = {(d.job_id, d.peer, d.level, d.dscp, d.traffic_class, d.sport,
                                d.tcp_dport, d.tcp_sports) for d in t.snapshot()}
        return out

    def generations(self) -> set[int]:
        out = set()
        for a in self.agents:
            with TableReader(a.table) as t:
                out.add(t.header().plan_generation)
        return out

    def followers_of(self, leader: Daemon) -> list[str]:
        """Agents whose link points at `leader` and reached it since."""
        want = self.addresses[leader.name]
        out = []
        for a in self.agents:
            reply = LocalClient(a.socket).call(apb.LocalRequest(
                status=apb.LocalStatusRequest(local_only=True)))
            if reply.status.agent.leader_address == want and reply.status.agent.leader_reachable:
                out.append(a.name)
        return out


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    etcd = EtcdCluster(tmp_path).start()
    token = secrets.token_hex(32)
    r = Rig(tmp_path, etcd, token)
    ha = {"ha": "etcd", "etcd_endpoints": etcd.endpoints, "etcd_lease_s": LEASE_S}
    ports = [free_port() for _ in range(3)]
    for i, port in enumerate(ports):
        name = f"l{i}"
        r.addresses[name] = f"127.0.0.1:{port}"
        d = Daemon(tmp_path, name, {"daemon": {"roles": ["leader"]}, "leader": {
            **ha, "listen": r.addresses[name], "debounce_ms": 10, "profiling_s": 0,
            "agent_timeout_s": 3}})
        _token_file(d.root / "state" / "leader.token", token)
        r.leaders.append(d.start())
    shared = tmp_path / "leader.token"
    _token_file(shared, token)
    for i in range(4):
        r.agents.append(Daemon(tmp_path, f"h{i}", {
            "daemon": {"roles": ["agent"]}, "leader": ha,
            "agent": {"leader": r.addresses["l0"],
                      "leader_fallback": [r.addresses["l1"], r.addresses["l2"]],
                      "addresses": [f"10.1.0.{i + 1}"], "gpus": 8, "report_interval_s": 0.5,
                      "reconnect_max_s": 1, "leader_token": str(shared)}}).start())
    jobs = []
    try:
        wait_for("a leader elected", r.active, 20)
        for i, a in enumerate(r.agents):
            a.wait_log("agent h")
            jobs.append(crux_run(a.socket, f"j{i}", "--gpus", "8",
                                 "--flops-per-iter", f"{(i + 1) * 1e15}", "--compute-s", "1"))
        yield r
    finally:
        for j in jobs:
            j.kill()
            j.wait()
        for d in [*r.agents, *r.leaders]:
            d.stop(timeout=10)
        etcd.stop()


def _token_file(path: Path, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token)
    path.chmod(0o640)


def _settled(rig: Rig, leader: Daemon, jobs: int) -> cpb.ClusterStatus:
    """The leader's status once it plans `jobs` jobs and every agent holds its plan."""
    def done() -> cpb.ClusterStatus | None:
        s = rig.status(leader)
        if s is None or s.ha_role != "active" or len(s.jobs) != jobs:
            return None
        if any(j.state != cpb.JOB_STATE_SCHEDULED for j in s.jobs):
            return None
        if rig.generations() != {s.plan_generation}:
            return None
        return s
    got: cpb.ClusterStatus = wait_for(f"{jobs} jobs planned at every agent", done, 30)
    return got


def _log_after(d: Daemon, offset: int) -> str:
    return d.log_text()[offset:]


def test_leader_failover_pause_and_etcd_faults(rig: Rig) -> None:
    first = rig.active()
    assert first is not None
    before = _settled(rig, first, 4)
    tables = rig.tables()
    assert all(tables.values()), tables
    standbys = [d for d in rig.leaders if d is not first]
    for d in standbys:  # standbys answer Status read-only, naming the active leader
        s = rig.status(d)
        assert s is not None and s.ha_role == "standby", rig.errors[-1:]
        assert s.active_leader == rig.addresses[first.name]

    # --- leader loss: SIGKILL the active leader ----------------------------------------
    first.send(signal.SIGKILL)
    killed = time.monotonic()
    second = wait_for("a standby to take over", lambda: rig.active(standbys), 15)
    took_over = time.monotonic() - killed
    assert first.proc is not None
    first.proc.wait()
    first.proc = None
    s = rig.status(second)
    assert s is not None and s.plan_generation == before.plan_generation and s.term > before.term
    wait_for("every agent to follow the new leader",
             lambda: len(rig.followers_of(second)) == 4, 15)
    followed = time.monotonic() - killed
    assert rig.tables() == tables and rig.generations() == {before.plan_generation}
    print(f"\nfailover after SIGKILL: new leader active in {took_over:.2f} s, every agent "
          f"following in {followed:.2f} s (lease {LEASE_S} s)")

    # --- leader paused past its lease -------------------------------------------------
    offsets = {a.name: len(a.log_text()) for a in rig.agents}
    second.send(signal.SIGSTOP)
    paused = time.monotonic()
    rest = [d for d in standbys if d is not second]
    try:
        third = wait_for("the last standby to take over", lambda: rig.active(rest), 15)
        took_over = time.monotonic() - paused
        time.sleep(max(0.0, 4.0 - (time.monotonic() - paused)))  # past agent_timeout_s too
    finally:
        woke_at = len(second.log_text())
        second.send(signal.SIGCONT)
    second.wait_log("stepping down", 15)
    woke = _log_after(second, woke_at)
    assert not re.search(r"plan \d+: \d+ job", woke), woke  # it published nothing
    wait_for("every agent to follow", lambda: len(rig.followers_of(third)) == 4, 15)
    assert rig.status(second).ha_role == "standby"  # type: ignore[union-attr]
    for a in rig.agents:  # nothing of the old term applied after the pause
        assert "applied" not in _log_after(a, offsets[a.name]) or \
            rig.tables()[a.name] == tables[a.name]
    assert rig.tables() == tables
    print(f"failover after SIGSTOP: new leader active in {took_over:.2f} s")

    # --- one etcd member lost: planning continues -------------------------------------
    rig.etcd.kill("m0")
    job = crux_run(rig.agents[0].socket, "late", "--gpus", "8", "--flops-per-iter", "9e15",
                   "--compute-s", "1")
    try:
        after_one = _settled(rig, third, 5)
        assert after_one.plan_generation > before.plan_generation
        assert not after_one.not_publishing

        # --- quorum lost: no new plan, agents keep theirs -----------------------------
        rig.etcd.kill("m1")
        held = rig.tables()
        generation = rig.generations()
        job2 = crux_run(rig.agents[1].socket, "stalled", "--gpus", "8",
                        "--flops-per-iter", "3e15", "--compute-s", "1")
        try:
            lost = wait_for("the leader to say it is not publishing",
                            lambda: (s := rig.status(third)) and s.not_publishing and s, 30)
            print(f"quorum lost: {lost.not_publishing}")
            assert rig.generations() == generation and rig.tables() == held
            assert all(a.proc is not None and a.proc.poll() is None for a in rig.agents)

            # --- quorum back: planning resumes -------------------------------------------
            rig.etcd.start("m0")
            rig.etcd.start("m1")
            resumed = _settled(rig, third, 6)
            assert resumed.plan_generation > after_one.plan_generation
            assert not resumed.not_publishing and resumed.term == lost.term
        finally:
            job2.kill()
            job2.wait()
    finally:
        job.kill()
        job.wait()
