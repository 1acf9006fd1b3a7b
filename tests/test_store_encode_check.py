"""A resumed plan must encode for every host before a takeover serves it
(cruxd.leader.store._check_encodes). The check encodes each decision once and each host's
envelope, instead of every host's whole message; here it is held to the definition (every
host's message encodes) on plans with values out of the wire's range anywhere (hypothesis),
and the collector pause around a decode (cruxd.leader.gc_pause) to its bookkeeping."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cruxd.control.host_plans import PublishedPlan
from cruxd.control.records import JobAssignment, JobState, PeerRoute
from cruxd.leader import store
from cruxd.leader.gc_pause import gc_paused
from cruxd.rpc import convert

HOSTS = [f"h{i}" for i in range(5)]


@st.composite
def wire_ints(draw: st.DrawFn, n: int) -> list[int]:
    """`n` values for uint32 / int32 fields: in range, or (1 in 12) one of them one past
    either end, so that about half the plans have one value somewhere that cannot go."""
    values = [draw(st.integers(0, 9)) for _ in range(n)]
    if draw(st.integers(0, 11)) == 0:
        values[draw(st.integers(0, n - 1))] = draw(st.sampled_from([-1, 1 << 31, 1 << 32]))
    return values


@st.composite
def routes(draw: st.DrawFn, hosts: tuple[str, ...]) -> PeerRoute:
    sport, nic_port, dport, tcp_sport = draw(wire_ints(4))
    return PeerRoute(draw(st.sampled_from(hosts)), draw(st.sampled_from(HOSTS)), ("10.0.0.1",),
                     sport=sport, nic_port=nic_port, tcp_dport=dport,
                     tcp_sports=(tcp_sport,) if draw(st.booleans()) else ())


@st.composite
def decisions(draw: st.DrawFn, i: int) -> JobAssignment:
    hosts = tuple(draw(st.lists(st.sampled_from(HOSTS), min_size=1, max_size=4, unique=True)))
    rank, level, dscp, gpus = draw(wire_ints(4))
    return JobAssignment(f"j{i}", JobState.SCHEDULED, rank=rank, level=level, dscp=dscp,
                         hosts=hosts, gpus=gpus,
                         routes=tuple(draw(st.lists(routes(hosts), max_size=3))))


@st.composite
def plans(draw: st.DrawFn) -> PublishedPlan:
    n = draw(st.integers(0, 4))
    jobs = tuple(draw(decisions(i)) for i in range(n))
    reprobe: dict[str, tuple[str, ...]] = {
        h: ("h0",) for h in draw(st.lists(st.sampled_from(HOSTS), max_size=2))}
    levels, term = draw(wire_ints(2))
    return PublishedPlan(3, 1000, levels or 1, jobs, reprobe=reprobe, term=term)


def _every_host_encodes(plan: PublishedPlan) -> bool:
    """The definition: what WatchPlan sends each host encodes."""
    try:
        for host in {h for a in plan.jobs for h in a.hosts} or {"-"}:
            convert.host_plan_to_pb(plan.for_host(host))
    except (ValueError, TypeError):
        return False
    return True


def _checked(plan: PublishedPlan) -> bool:
    try:
        store._check_encodes(plan, None)
    except (ValueError, TypeError):
        return False
    return True


@settings(max_examples=400)
@given(plans())
def test_the_check_refuses_exactly_the_plans_some_host_could_not_be_sent(
        plan: PublishedPlan) -> None:
    assert _checked(plan) == _every_host_encodes(plan)


def test_a_route_out_of_range_is_refused_where_the_document_is_read() -> None:
    bad = JobAssignment("j0", JobState.SCHEDULED, hosts=("h0", "h1"), routes=(
        PeerRoute("h1", "h0", ("10.0.0.1",), sport=1 << 32),))
    assert not _checked(PublishedPlan(3, 1000, 1, (bad,)))
    assert not _every_host_encodes(PublishedPlan(3, 1000, 1, (bad,)))
    assert _checked(PublishedPlan(3, 1000, 1, (JobAssignment("j0", JobState.SCHEDULED,
                                                              hosts=("h0",)),)))


@contextmanager
def _collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        if not was:
            gc.disable()


def test_the_collector_runs_again_when_the_last_overlapping_decode_ends() -> None:
    inside, release = threading.Event(), threading.Event()

    def other_decode() -> None:
        with gc_paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other_decode)
    with _collector_on():
        with gc_paused():
            assert not gc.isenabled()
            t.start()
            assert inside.wait(10)
        assert not gc.isenabled()  # the other thread's decode is still under way
        release.set()
        t.join(10)
        assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    with _collector_on():
        gc.disable()
        with gc_paused():
            pass
        assert not gc.isenabled()
        gc.enable()
        with pytest.raises(RuntimeError), gc_paused():
            raise RuntimeError("a decode that fails")
        assert gc.isenabled()
