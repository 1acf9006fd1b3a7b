"""Issue 37, item 2: one job may not stall the others' posts through the PCIe semaphore file.

Every job in the agent's group maps /run/crux/pcie read-write. Each test here is one attack by a
member process on libcrux_pcie.so (through transport/pcie.py), run as real processes on a real
file: the attacker stops itself inside a link's internal mutex, holds a link and never releases,
writes holder_pid = 1 into the file, or is stopped while holding; and the agent revokes a hold.
Before the fix the first hung a level-7 acquire_timed(0.5 s) for ever and the others made every
acquire wait out its timeout. Now each must end within the bounds of crux_pcie.h ("Trust"):
2 ms for the internal mutex, the 20 ms lease, the 10 ms poll.

The wall-clock assertions only tell "bounded" from "hung or waited out its timeout" (BOUND = 2 s
against timeouts of 5 s or for ever); bench/pcie.py --attacks measures the latencies.
"""

from __future__ import annotations

import errno
import mmap
import multiprocessing as mp
import os
import signal
import struct
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from cruxd.testing import wait_for
from tests.test_pcie_gate import LINK, UNGATED, Drive, drives, prog  # noqa: F401 (fixture)
from transport.pcie import LAYOUT, LEASE_ENV, PcieLockError, PcieLocks
from transport.pcie_links import DeviceLink

CTX = mp.get_context("fork")
DEADLINE = 30.0  # waits for a state: generous, never the measure
BOUND = 2.0  # what "bounded" means here
TIMEOUT = 5.0  # acquire timeouts the bug would wait out


@pytest.fixture(autouse=True)
def _default_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LEASE_ENV, raising=False)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    p = tmp_path / "pcie"
    PcieLocks.create(p, 2).close()
    return p


@pytest.fixture
def locks(path: Path) -> Iterator[PcieLocks]:
    with PcieLocks.open(path) as lk:
        yield lk


@pytest.fixture
def procs() -> Iterator[list[mp.process.BaseProcess]]:
    """Children to SIGKILL at the end (stopped ones too)."""
    made: list[mp.process.BaseProcess] = []
    yield made
    for p in made:
        if p.pid is not None and p.exitcode is None:
            os.kill(p.pid, signal.SIGKILL)
        p.join(DEADLINE)


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def _stopped(pid: int) -> Callable[[], bool]:
    return lambda: _state(pid) in "Tt"


# ---- children ---------------------------------------------------------------------------


def _lock_internal_and_stop(path: Path, link: int) -> None:
    """The attacker of (a): takes the link's internal mutex and stops itself holding it."""
    lk = PcieLocks.open(path)
    lk._test_lock_internal(link)
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(3600)


def _hold(path: Path, link: int, level: int, conn: Connection) -> None:
    """Acquire, say so, then on each command 'release' report the errno of a release (0: ok)."""
    lk = PcieLocks.open(path)
    lk.acquire(link, level, timeout=DEADLINE)
    conn.send("held")
    while conn.recv() == "release":
        try:
            lk.release(link)
            conn.send(0)
        except PcieLockError as e:
            conn.send(e.errno)


def _timed_acquire(path: Path, link: int, level: int, timeout: float, conn: Connection) -> None:
    """Report (errno or 0, seconds) of one acquire_timed, and of a release when it was had."""
    lk = PcieLocks.open(path)
    t0 = time.monotonic()
    try:
        lk.acquire(link, level, timeout=timeout)
        rc = 0
    except PcieLockError as e:
        rc = e.errno or -1
    conn.send((rc, time.monotonic() - t0))
    if rc == 0:
        lk.release(link)


def _start(procs: list[mp.process.BaseProcess], target: Callable[..., None],
           *args: object) -> mp.process.BaseProcess:
    p = CTX.Process(target=target, args=args, daemon=True)
    p.start()
    procs.append(p)
    return p


def _holder(procs: list[mp.process.BaseProcess], path: Path, link: int,
            level: int) -> tuple[mp.process.BaseProcess, Connection]:
    mine, theirs = CTX.Pipe()
    p = _start(procs, _hold, path, link, level, theirs)
    assert mine.poll(DEADLINE) and mine.recv() == "held"
    return p, mine


def _acquire_in_child(procs: list[mp.process.BaseProcess], path: Path, link: int, level: int,
                      timeout: float) -> tuple[int, float]:
    """One acquire in a separate process: the bug hangs it for ever, which must fail the test
    rather than the run."""
    mine, theirs = CTX.Pipe()
    _start(procs, _timed_acquire, path, link, level, timeout, theirs)
    assert mine.poll(timeout + BOUND + 5), "the acquire hung"
    result: tuple[int, float] = mine.recv()
    return result


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def _poke(path: Path, link: int, offset: int, fmt: str, *values: object) -> None:
    """A member writing into the mapped file, as any job in the group can."""
    fd = os.open(path, os.O_RDWR)
    try:
        with mmap.mmap(fd, 0) as m:
            struct.pack_into(fmt, m, LAYOUT.link(link) + offset, *values)
    finally:
        os.close(fd)


def _start_time(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[19])


# ---- (a) a member stopped inside a link's internal mutex --------------------------------


def test_a_stopped_internal_mutex_holder_bounds_acquire(
        locks: PcieLocks, path: Path, procs: list[mp.process.BaseProcess]) -> None:
    attacker = _start(procs, _lock_internal_and_stop, path, 0)
    assert attacker.pid is not None
    wait_for("attacker stopped", _stopped(attacker.pid), DEADLINE, 0.005)
    rc, took = _acquire_in_child(procs, path, 0, 7, 0.5)
    assert rc == errno.EBUSY and took < BOUND  # failed open, nothing queued
    with pytest.raises(PcieLockError) as e:
        locks.stats(0)
    assert e.value.errno == errno.EBUSY
    os.kill(attacker.pid, signal.SIGKILL)
    attacker.join(DEADLINE)
    locks.acquire(0, 3, timeout=DEADLINE)  # EOWNERDEAD: repaired, and no stale queue slot
    st = locks.stats(0)
    assert st.holder_pid == os.getpid() and st.repairs == 1 and sum(st.waiters) == 0
    locks.release(0)


def test_a_queued_waiter_and_the_holder_get_out_while_the_mutex_is_stuck(
        locks: PcieLocks, path: Path, procs: list[mp.process.BaseProcess]) -> None:
    locks.acquire(0, 7)
    mine, theirs = CTX.Pipe()
    _start(procs, _timed_acquire, path, 0, 3, 0.5, theirs)  # queued below us: no lease
    wait_for("waiter queued", lambda: locks.stats(0).waiters[3] == 1, DEADLINE, 0.005)
    attacker = _start(procs, _lock_internal_and_stop, path, 0)
    assert attacker.pid is not None
    wait_for("attacker stopped", _stopped(attacker.pid), DEADLINE, 0.005)
    assert mine.poll(0.5 + BOUND + 5), "the queued waiter hung"
    rc, took = mine.recv()
    assert rc in (errno.EBUSY, errno.ETIMEDOUT) and took < 0.5 + BOUND
    assert _timed(lambda: locks.release(0)) < BOUND  # lock-free fallback: our hold is cleared
    os.kill(attacker.pid, signal.SIGKILL)
    attacker.join(DEADLINE)
    st = locks.stats(0)  # the abandoned queue slot is dropped, not left to block the link
    assert st.holder_pid == 0 and sum(st.waiters) == 0 and st.stale + st.repairs >= 1
    locks.acquire(0, 0, timeout=DEADLINE)
    locks.release(0)


# ---- (b) a holder that never releases ---------------------------------------------------


def test_b_a_never_releasing_low_holder_loses_the_link_after_the_lease(
        locks: PcieLocks, path: Path, procs: list[mp.process.BaseProcess]) -> None:
    _, conn = _holder(procs, path, 0, 0)
    took = _timed(lambda: locks.acquire(0, 7, timeout=TIMEOUT))
    assert took < BOUND
    st = locks.stats(0)
    assert st.holder_pid == os.getpid() and st.expired == 1
    conn.send("release")  # the old holder's release changes nothing
    assert conn.recv() == errno.EPERM
    assert locks.stats(0).holder_pid == os.getpid()
    locks.release(0)


def test_b_the_lease_never_hands_a_higher_hold_to_a_lower_level(
        locks: PcieLocks, path: Path, procs: list[mp.process.BaseProcess]) -> None:
    holder, conn = _holder(procs, path, 0, 5)
    with pytest.raises(PcieLockError) as e:  # lower levels wait (their own timeout), as ever
        locks.acquire(0, 2, timeout=0.2)
    assert e.value.errno == errno.ETIMEDOUT
    st = locks.stats(0)
    assert st.holder_pid == holder.pid and st.expired == 0
    conn.send("release")
    assert conn.recv() == 0


# ---- (c) a member writes holder_pid = 1 -------------------------------------------------


def test_c_a_written_holder_pid_is_not_the_holder(locks: PcieLocks, path: Path) -> None:
    # level 7: no waiter may end it by lease, so only the start-time check can
    _poke(path, 0, LAYOUT.holder_pid, "<iI", 1, 7)
    _poke(path, 0, LAYOUT.held_since_ns, "<q", time.monotonic_ns())
    assert locks.stats(0).holder_pid == 0  # stats purges it too; write it again
    assert locks.stats(0).foreign == 1
    _poke(path, 0, LAYOUT.holder_pid, "<iI", 1, 7)
    _poke(path, 0, LAYOUT.held_since_ns, "<q", time.monotonic_ns())
    took = _timed(lambda: locks.acquire(0, 0, timeout=TIMEOUT))
    assert took < BOUND
    st = locks.stats(0)
    assert st.holder_pid == os.getpid() and st.foreign == 2
    locks.release(0)


def test_c_a_forged_holder_with_its_start_time_is_bounded_by_lease_and_timeout(
        locks: PcieLocks, path: Path) -> None:
    """The start time of pid 1 is public: a member that forges it too passes for pid 1. Then
    the lease ends the hold for equal and higher levels, and lower ones time out (fail open)."""
    _poke(path, 0, LAYOUT.holder_pid, "<iI", 1, 4)
    _poke(path, 0, LAYOUT.holder_start, "<Qq", _start_time(1) + 1, time.monotonic_ns())
    with pytest.raises(PcieLockError) as e:
        locks.acquire(0, 3, timeout=0.2)
    assert e.value.errno == errno.ETIMEDOUT
    assert _timed(lambda: locks.acquire(0, 4, timeout=TIMEOUT)) < BOUND
    st = locks.stats(0)
    assert st.holder_pid == os.getpid() and st.expired == 1
    locks.release(0)


def test_c_forged_queue_entries_do_not_block_the_link(locks: PcieLocks, path: Path) -> None:
    """A written waiter slot (pid 1 at level 7, never refreshed) would be the best waiter for
    ever, and nobody else is granted while a better waiter is queued."""
    slot = LAYOUT.queue
    _poke(path, 0, slot, "<iIQQq", 1, 7, 0, _start_time(1) + 1, time.monotonic_ns())
    _poke(path, 0, LAYOUT.nwaiters, "<I", 1)
    assert _timed(lambda: locks.acquire(0, 0, timeout=TIMEOUT)) < BOUND
    assert locks.stats(0).stale == 1
    locks.release(0)


# ---- (d) a stopped holder, a stopped waiter ---------------------------------------------


def test_d_a_stopped_holder_loses_the_link(locks: PcieLocks, path: Path,
                                           procs: list[mp.process.BaseProcess]) -> None:
    holder, conn = _holder(procs, path, 0, 7)  # level 7: a lease would never end it for us
    assert holder.pid is not None
    os.kill(holder.pid, signal.SIGSTOP)
    wait_for("holder stopped", _stopped(holder.pid), DEADLINE, 0.005)
    assert _timed(lambda: locks.acquire(0, 0, timeout=TIMEOUT)) < BOUND
    st = locks.stats(0)
    assert st.holder_pid == os.getpid() and st.stopped == 1
    os.kill(holder.pid, signal.SIGCONT)
    conn.send("release")
    assert conn.recv() == errno.EPERM  # not the holder any more: nothing changes
    assert locks.stats(0).holder_pid == os.getpid()
    locks.release(0)


def test_d_a_stopped_best_waiter_does_not_block_the_others(
        locks: PcieLocks, path: Path, procs: list[mp.process.BaseProcess]) -> None:
    locks.acquire(0, 7)
    top_conn, theirs = CTX.Pipe()
    top = _start(procs, _timed_acquire, path, 0, 6, DEADLINE, theirs)
    wait_for("top queued", lambda: locks.stats(0).waiters[6] == 1, DEADLINE, 0.005)
    assert top.pid is not None
    os.kill(top.pid, signal.SIGSTOP)
    wait_for("top stopped", _stopped(top.pid), DEADLINE, 0.005)
    low_conn, theirs = CTX.Pipe()
    _start(procs, _timed_acquire, path, 0, 1, TIMEOUT, theirs)
    wait_for("low queued", lambda: locks.stats(0).waiters[1] == 1, DEADLINE, 0.005)
    locks.release(0)
    assert low_conn.poll(TIMEOUT + BOUND + 5)
    rc, took = low_conn.recv()
    assert rc == 0 and took < TIMEOUT  # before the fix: waited out its 5 s
    assert locks.stats(0).stopped == 1
    os.kill(top.pid, signal.SIGCONT)  # it queues again and gets the link in its turn
    assert top_conn.poll(DEADLINE)
    assert top_conn.recv()[0] == 0


# ---- (e) the agent revokes a hold -------------------------------------------------------


def test_e_the_agent_revokes_a_hold(locks: PcieLocks, path: Path,
                                    procs: list[mp.process.BaseProcess]) -> None:
    holder, conn = _holder(procs, path, 0, 3)
    assert holder.pid is not None
    assert not locks.revoke(0, holder.pid + 1)  # not that pid's
    assert locks.revoke(0, holder.pid)
    st = locks.stats(0)
    assert st.holder_pid == 0 and st.revoked == 1
    assert not locks.revoke(0)  # nothing held
    new_holder, new_conn = _holder(procs, path, 0, 1)
    conn.send("release")  # the revoked holder's late release fails and changes nothing
    assert conn.recv() == errno.EPERM
    assert locks.stats(0).holder_pid == new_holder.pid
    assert locks.revoke_pid(new_holder.pid) == [0]
    new_conn.send("release")
    assert new_conn.recv() == errno.EPERM


def test_e_revoke_stuck_takes_only_old_holds(locks: PcieLocks, path: Path,
                                             procs: list[mp.process.BaseProcess]) -> None:
    holder, _ = _holder(procs, path, 1, 2)
    assert locks.revoke_stuck(3600) == []
    time.sleep(0.05)
    assert locks.revoke_stuck(0.01) == [(1, holder.pid)]
    assert locks.stats(1).holder_pid == 0


def test_e_the_agents_dataplane_takes_back_a_stuck_hold(tmp_path: Path,
                                                        procs: list[mp.process.BaseProcess]
                                                        ) -> None:
    """What the agent calls once a second (Agent._pcie_tick): holds seen for max_hold_s."""
    from cruxd.agent.dataplane import DataPlane

    dp = DataPlane(tmp_path / "decisions", sysfs_root=str(tmp_path / "nosys"))
    PcieLocks.create(dp.pcie_path, 2).close()
    assert dp.revoke_stuck(0.01) == []  # no shared links on this host: nothing to do
    dp.pcie_links = 2  # as start() sets it on a host whose GPUs and NICs share a switch
    holder, _ = _holder(procs, dp.pcie_path, 0, 0)
    try:
        assert dp.revoke_stuck(3600) == []  # the first look starts the hold's clock
        time.sleep(0.05)
        assert dp.revoke_stuck(0.01) == [(0, holder.pid)]
        with PcieLocks.open(dp.pcie_path) as lk:
            assert lk.stats(0).holder_pid == 0
        # and an operator sees it: the agent's status counts it, and says it
        took = dp.pcie_takeovers()
        assert took["revoked"] == 1 and took["expired"] == took["foreign"] == 0
        from rich.console import Console

        from cruxd.cli.status_view import print_status
        from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb

        console = Console(record=True, width=200)
        print_status(console, apb.LocalAgentStatus(
            host_id="h0", pcie_links=2, pcie_takeovers=apb.PcieTakeovers(**took)), None, 0.0)
        assert "PCIe holds taken back: 1 revoked by the agent" in console.export_text()
    finally:
        dp.close()


# ---- the wrapper's gate notices a lost link ---------------------------------------------


@pytest.fixture
def rig(prog: Path, tmp_path: Path) -> Iterator[Callable[..., Drive]]:  # noqa: F811 (the fixture)
    yield from drives(prog, tmp_path, (DeviceLink("mlx5_0", 1, None),))


def test_gate_notices_a_revoked_link_at_its_next_post(rig: Callable[..., Drive],
                                                      tmp_path: Path) -> None:
    d = rig(1, max_wait_ms=50)
    d("qp 0", "post 0 1")
    with PcieLocks.open(tmp_path / "pcie") as sem:
        assert sem.stats(LINK).holder_pid == d.pid
        assert sem.revoke(LINK, d.pid)
        sem.acquire(LINK, 7)  # someone else has it now
        d("post 0 1")  # not the holder any more: it must wait (50 ms) and go ungated
        assert d.ungated("timeout") == 1
        sem.release(LINK)
        d("post 0 1")  # and takes it back once free
        assert sem.stats(LINK).holder_pid == d.pid
