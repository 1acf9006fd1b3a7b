"""The agent's sweep loop and schedule, with a hash prober standing in for the fabric
(the real TTL prober runs in test_probing_agents.py on the namespace rig)."""

from __future__ import annotations

import asyncio
import ipaddress

from cruxd.agent.sweeper import SweepProbing, problems
from cruxd.config.parse import parse_config
from cruxd.control.records import HostPlan, JobAssignment, JobState, PeerRoute
from probing.schedule import ProbeSchedule
from probing.sweep import SweepResult
from probing.ttl import ProbeCounters
from tests.test_probing_core import HashProber


class Fabric:
    """Per peer address, the number of paths; whether each path is up."""

    def __init__(self) -> None:
        self.down: set[str] = set()
        self.made = 0

    def __call__(self, address: str) -> HashProber:
        self.made += 1
        fabric = self

        class Prober(HashProber):
            def trace(self, sport: int) -> tuple[str, ...] | None:
                hops = super().trace(sport)
                return None if hops and hops[1] in fabric.down else hops

            def close(self) -> None:
                pass

            def problems(self) -> tuple[int, str]:
                return 0, ""

        return Prober(4 if address.endswith(".2") else 2, seed=7)


def plan(gen: int, *peers: tuple[str, str], reprobe: tuple[str, ...] = ()) -> HostPlan:
    routes = tuple(PeerRoute("h0", host, (addr,)) for host, addr in peers)
    return HostPlan(gen, "h0", 0, 4, (JobAssignment("a", JobState.UNMEASURED, routes=routes),),
                    reprobe)


def test_peers_from_the_plan_are_swept_refused_and_reprobed() -> None:
    cfg = parse_config('[agent]\nprobing = "sweep"\n[probing]\nfabric_prefixes = ["10.2.0.0/16"]'
                       "\nrate_pps = 1000\nresponder = false\n", "<t>").probing
    changes: list[int] = []
    fabric = Fabric()

    async def run() -> None:
        sp = SweepProbing(cfg, "h0", lambda: changes.append(1), fabric)  # type: ignore[arg-type]
        await sp.start()
        sp.plan_changed(plan(1, ("h1", "10.2.1.2"), ("h2", "10.2.2.3"), ("x", "192.0.2.1")))
        while sp.sweeps < 2:
            await asyncio.sleep(0.01)
        first = {t.dst_host: t for t in sp.paths()}
        assert [len(first[h].paths) for h in ("h1", "h2")] == [4, 2]
        assert first["x"].paths == () and "no address inside" in first["x"].last_error
        # a path goes down; the leader asks for a re-probe of h1 only
        fabric.down.add("spine3")
        sp.plan_changed(plan(2, ("h1", "10.2.1.2"), ("h2", "10.2.2.3"), reprobe=("h1",)))
        while sp.sweeps < 3:
            await asyncio.sleep(0.01)
        again = {t.dst_host: t for t in sp.paths()}
        assert {p.hops[1] for p in again["h1"].paths} == {"spine0", "spine1", "spine2"}
        # the surviving paths keep their ports: known ports are probed first
        old = {p.hops: p.sports for p in first["h1"].paths}
        assert all(old[p.hops] == p.sports for p in again["h1"].paths)
        assert again["h2"] == first["h2"] and "x" not in again  # not due; no longer a peer
        await sp.stop()

    asyncio.run(run())
    assert fabric.made == 3 and changes


def test_a_sweep_says_what_changed() -> None:
    s = ProbeSchedule((ipaddress.ip_network("10.0.0.0/8"),), interval_s=60)
    s.set_peers({"a": ["10.0.0.1"]}, now=0.0)
    r = SweepResult("a", {("l", "s0"): [49152]})
    assert s.record("a", r, 0, "", 1.0, 1000) == "1 new path(s)"
    tcp = SweepResult("a", {("l", "s0"): [61001, 61002]})
    assert s.record("a", r, 0, "", 2.0, 2000, {5201: tcp}) == (
        "via s0: TCP/5201 -[] +[61001, 61002]")
    moved = SweepResult("a", {("l", "s0"): [61002, 61001]})
    assert s.record("a", r, 0, "", 3.0, 3000, {5201: moved}) == (
        "via s0: TCP/5201 -[] +[] (reordered)")
    two = SweepResult("a", {("l", "s1"): [49153]})
    assert s.record("a", two, 0, "", 4.0, 4000, {5201: moved}) == (
        "1 new path(s), via s0: UDP [49152] -> []")  # s0 stays, by its TCP ports
    assert s.record("a", two, 0, "", 5.0, 5000) == "1 path(s) gone"
    assert s.record("a", two, 0, "", 6.0, 6000) == ""


def test_schedule_order_and_due_times() -> None:
    s = ProbeSchedule((ipaddress.ip_network("10.0.0.0/8"),), interval_s=60)
    assert s.set_peers({"b": ["10.0.0.2"], "a": ["fe80::1", "10.0.0.1"]}, now=5.0)
    assert not s.set_peers({"b": ["10.0.0.2"], "a": ["10.0.0.1"]}, now=6.0)
    assert (s.peers["a"].address, s.next_due().host) == ("10.0.0.1", "a")  # type: ignore[union-attr]
    r = SweepResult("a", {("l", "s0"): [49152]}, probes_sent=9)
    assert s.record("a", r, 1, "x", now=7.0, now_unix_ms=7000) == "1 new path(s)"
    assert not s.record("a", r, 0, "", now=8.0, now_unix_ms=8000)  # same paths: no change
    assert s.peers["a"].due == 68.0 and s.next_due().host == "b"  # type: ignore[union-attr]
    s.request(["a", "unknown"], now=9.0)
    assert s.peers["a"].due == 9.0
    assert list(s.sports(s.peers["a"], range(49150, 49154))) == [49152, 49150, 49151, 49153]
    s.failed("b", "socket: permission denied", now=9.0, retry_s=30)
    assert (s.peers["b"].errors, s.peers["b"].due) == (1, 39.0)
    assert not s.record("gone", r, 0, "", 1.0, 1)


def test_what_is_asked_during_a_sweep_gets_a_sweep_of_its_own() -> None:
    """A reprobe or a new port that arrives while a sweep toward the peer is under way may
    be missed by it: the sweep after comes at once, not an interval later (a job's port
    asked for mid-sweep went unprobed for the whole interval on the testbed)."""
    s = ProbeSchedule((ipaddress.ip_network("10.0.0.0/8"),), interval_s=60)
    s.set_peers({"a": ["10.0.0.1"]}, now=1.0, dports={"a": (5301,)})
    r = SweepResult("a", {("l", "s0"): [49152]}, probes_sent=9)
    s.started("a")
    s.set_peers({"a": ["10.0.0.1"]}, now=2.0, dports={"a": (5301, 5302)})  # mid-sweep
    s.record("a", r, 0, "", now=3.0, now_unix_ms=3000)
    assert s.peers["a"].due == 3.0  # again at once, now with 5302
    s.started("a")
    s.record("a", r, 0, "", now=4.0, now_unix_ms=4000)
    assert s.peers["a"].due == 64.0  # nothing asked meanwhile: the interval
    s.started("a")
    s.request(["a"], now=5.0)  # a reprobe mid-sweep
    s.record("a", r, 0, "", now=6.0, now_unix_ms=6000)
    assert s.peers["a"].due == 6.0


def test_problems_name_the_commonest_reason_and_the_last_silent_port() -> None:
    quiet, noisy = ProbeCounters(), ProbeCounters()
    assert problems([quiet]) == (0, "")
    quiet.timeouts, quiet.last_miss = 2, "port 61000, hop 4"
    noisy.ignore("not ours")
    assert problems([quiet, noisy]) == (3, "no reply (2), last: port 61000, hop 4")
    for _ in range(3):
        noisy.ignore("not ours")
    assert problems([quiet, noisy]) == (6, "not ours (4)")  # the silent port only with its reason
