"""The HA rig of tests/test_ha_etcd.py and bench/ha.py: a real 3-member etcd on loopback,
three cruxd leader candidates (leader role only, one shared token) and agent-only cruxd
processes that know all three and the etcd members, each running one job."""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb
from cruxd.rpc.gen.crux.v1 import leader_pb2_grpc as lgrpc
from cruxd.rpc.local import LocalClient
from cruxd.testing.etcd_rig import EtcdCluster
from cruxd.testing.rig import Daemon, crux_run, free_port, wait_for
from transport.decision_table import TableReader


@dataclass
class HaRig:
    root: Path
    agents_n: int = 4
    lease_s: int = 2
    # merged into the candidates' [leader] and [control]: bench/ha.py --simulated runs
    # them on a topology file, with the timeouts of a large cluster
    leader_extra: dict[str, object] = field(default_factory=dict)
    control_extra: dict[str, object] = field(default_factory=dict)
    leader_log_level: str = "debug"  # a leader of 10,000 hosts logs less
    etcd: EtcdCluster = field(init=False)
    token: str = field(default_factory=lambda: secrets.token_hex(32))
    leaders: list[Daemon] = field(default_factory=list)
    agents: list[Daemon] = field(default_factory=list)
    jobs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    addresses: dict[str, str] = field(default_factory=dict)  # leader name -> host:port
    errors: list[str] = field(default_factory=list)  # failed Status calls, for failures

    def start(self) -> HaRig:
        self.etcd = EtcdCluster(self.root).start()
        ha = {"ha": "etcd", "etcd_endpoints": self.etcd.endpoints, "etcd_lease_s": self.lease_s,
              "etcd_insecure": True}  # a plaintext etcd on loopback: the rig's own
        for i in range(3):
            name = f"l{i}"
            self.addresses[name] = f"127.0.0.1:{free_port()}"
            # agents find a paused leader by keepalive (1.5 x keepalive_s): within the 3 s
            # a successor gives the hosts it restored before expiring them
            d = Daemon(self.root, name, {
                "daemon": {"roles": ["leader"], "log_level": self.leader_log_level},
                "leader": {**ha, "listen": self.addresses[name], "debounce_ms": 10,
                           "profiling_s": 0, "agent_timeout_s": 3, **self.leader_extra},
                "control": {"keepalive_s": 1, **self.control_extra}}, die_with_parent=True)
            _token_file(d.root / "state" / "leader.token", self.token)
            self.leaders.append(d.start())
        shared = self.root / "leader.token"
        _token_file(shared, self.token)
        names = list(self.addresses)
        for i in range(self.agents_n):
            self.agents.append(Daemon(self.root, f"h{i}", {
                "daemon": {"roles": ["agent"]}, "leader": ha,
                "agent": {"leader": self.addresses[names[i % 3]],
                          "leader_fallback": [self.addresses[n] for n in names],
                          "addresses": [f"10.1.{i // 250}.{i % 250 + 1}"], "gpus": 8,
                          "report_interval_s": 0.5, "reconnect_max_s": 1,
                          "leader_token": str(shared)},
                "control": {"keepalive_s": 1}}, die_with_parent=True).start())
        wait_for("a leader elected", self.active, 20)
        for i, a in enumerate(self.agents):
            a.wait_log("agent h")
            self.jobs.append(crux_run(a.socket, f"j{i}", "--gpus", "8", "--flops-per-iter",
                                      f"{(i + 1) * 1e15}", "--compute-s", "1",
                                      die_with_parent=True))
        return self

    def stop(self) -> None:
        for j in self.jobs:
            j.kill()
            j.wait()
        for d in [*self.agents, *self.leaders]:
            d.stop(timeout=10)
        if hasattr(self, "etcd"):
            self.etcd.stop()

    def status(self, d: Daemon, brief: bool = False) -> cpb.ClusterStatus | None:
        """`brief`: the leader's own fields (StatusRequest.brief), which a failover watcher
        needs: a full one of 10,000 hosts took a new leader's CPU from the agents following
        it, and a call timed out was computed anyway."""
        # a status of 10,000 hosts (bench/ha.py --simulated) is over gRPC's 4 MB default
        with grpc.insecure_channel(self.addresses[d.name], options=[
                ("grpc.max_receive_message_length", 512 << 20)]) as ch:
            stub = lgrpc.LeaderStub(ch)  # type: ignore[no-untyped-call]
            try:
                got: cpb.ClusterStatus = stub.Status(
                    lpb.StatusRequest(brief=brief), timeout=2,
                    metadata=(("authorization", f"Bearer {self.token}"),))
                return got
            except grpc.RpcError as exc:
                self.errors.append(f"{d.name}: {exc}")
                return None

    def active(self, among: list[Daemon] | None = None) -> Daemon | None:
        found = [d for d in among or self.leaders
                 if d.proc is not None and (s := self.status(d, brief=True))
                 and s.ha_role == "active"]
        assert len(found) <= 1, [d.name for d in found]
        return found[0] if found else None

    def tables(self) -> dict[str, set[tuple[object, ...]]]:
        """Every agent's decisions, without the generation that made them."""
        out: dict[str, set[tuple[object, ...]]] = {}
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

    def settled(self, leader: Daemon, jobs: int, timeout: float = 30) -> cpb.ClusterStatus:
        """The leader's status once it plans `jobs` jobs and every agent holds its plan."""
        def done() -> cpb.ClusterStatus | None:
            s = self.status(leader)
            if s is None or s.ha_role != "active" or len(s.jobs) != jobs:
                return None
            if any(j.state != cpb.JOB_STATE_SCHEDULED for j in s.jobs):
                return None
            return s if self.generations() == {s.plan_generation} else None
        got: cpb.ClusterStatus = wait_for(f"{jobs} jobs planned at every agent", done, timeout)
        return got


def _token_file(path: Path, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token)
    path.chmod(0o640)
