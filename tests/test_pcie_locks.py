"""PCIe semaphores (shim/crux_pcie.c via transport/pcie.py): real processes, real shared memory.

Every wait is a bounded poll with a generous deadline (30 s): a deadlock fails the test, but no
test asserts on how fast anything is. The library is the installed one (transport/native.py).

These tests hold links for as long as they like while equal or higher levels wait, and count on
mutual exclusion under load: they turn the lease off (CRUX_PCIE_LEASE_MS=0, read at open, and
inherited by the forked children). tests/test_pcie_attacks.py tests the lease.
"""

from __future__ import annotations

import errno
import mmap
import multiprocessing as mp
import os
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cruxd.testing import wait_for
from transport.pcie import (
    LEASE_ENV,
    LEVELS,
    QUEUE_LEN,
    PcieLockError,
    PcieLocks,
    load_library,
    shared_links,
)

CTX = mp.get_context("fork")
DEADLINE = 30.0


@pytest.fixture(autouse=True)
def _no_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LEASE_ENV, "0")


@pytest.fixture
def path(tmp_path: Path) -> Path:
    p = tmp_path / "pcie"
    PcieLocks.create(p, 4).close()
    return p


@pytest.fixture
def locks(path: Path) -> Iterator[PcieLocks]:
    with PcieLocks.open(path) as lk:
        yield lk


def _grab(path: Path, link: int, level: int, tag: str, out: Path) -> None:
    """Child: acquire, append tag (grant order), release."""
    lk = PcieLocks.open(path)
    lk.acquire(link, level, timeout=DEADLINE)
    with open(out, "a") as f:
        f.write(tag + "\n")
    lk.release(link)


def _hold_forever(path: Path, link: int) -> None:
    lk = PcieLocks.open(path)
    lk.acquire(link, 1, timeout=DEADLINE)
    time.sleep(3600)


def _lock_internal_forever(path: Path, link: int, ready: threading.Event) -> None:
    lk = PcieLocks.open(path)
    lk._test_lock_internal(link)
    ready.set()
    time.sleep(3600)


def _start(target: Callable[..., None], *args: object) -> mp.process.BaseProcess:
    p = CTX.Process(target=target, args=args, daemon=True)
    p.start()
    return p


def _join_ok(*procs: mp.process.BaseProcess) -> None:
    for p in procs:
        p.join(DEADLINE)
        assert p.exitcode == 0, f"child exit {p.exitcode}"


def _queue(locks: PcieLocks, path: Path, link: int, arrivals: list[int],
           out: Path) -> list[mp.process.BaseProcess]:
    """Start one child per level in `arrivals`, each fully queued before the next starts."""
    procs = []
    for i, level in enumerate(arrivals):
        procs.append(_start(_grab, path, link, level, f"{i}:{level}", out))

        def queued(n: int = i + 1) -> bool:
            return sum(locks.stats(link).waiters) == n

        wait_for(f"{i + 1} queued", queued, DEADLINE, 0.005)
    return procs


def _order(out: Path) -> list[str]:
    return out.read_text().split()


# ---- grant rule -------------------------------------------------------------------------


def test_higher_level_goes_first(locks: PcieLocks, path: Path, tmp_path: Path) -> None:
    out = tmp_path / "order"
    locks.acquire(0, 1)
    procs = _queue(locks, path, 0, [0, 3], out)
    st0 = locks.stats(0)
    assert st0.holder_pid == os.getpid() and st0.holder_level == 1
    assert st0.waiters[0] == 1 and st0.waiters[3] == 1
    locks.release(0)
    _join_ok(*procs)
    assert _order(out) == ["1:3", "0:0"]


def test_fifo_within_level(locks: PcieLocks, path: Path, tmp_path: Path) -> None:
    out = tmp_path / "order"
    locks.acquire(2, 0)
    procs = _queue(locks, path, 2, [2, 2, 2, 2], out)
    locks.release(2)
    _join_ok(*procs)
    assert _order(out) == ["0:2", "1:2", "2:2", "3:2"]


@settings(max_examples=8)
@given(st.lists(st.integers(0, LEVELS - 1), min_size=1, max_size=5))
def test_schedules_follow_grant_rule(tmp_path_factory: pytest.TempPathFactory,
                                     arrivals: list[int]) -> None:
    d = tmp_path_factory.mktemp("sched")
    path, out = d / "pcie", d / "order"
    with PcieLocks.create(path, 1) as locks:
        locks.acquire(0, 0)
        procs = _queue(locks, path, 0, arrivals, out)
        locks.release(0)
        _join_ok(*procs)
        want = sorted(range(len(arrivals)), key=lambda i: (-arrivals[i], i))
        assert _order(out) == [f"{i}:{arrivals[i]}" for i in want]
        assert locks.stats(0).grants == len(arrivals) + 1


def test_links_are_independent(locks: PcieLocks) -> None:
    locks.acquire(0, 0)
    locks.acquire(1, 0, timeout=DEADLINE)  # a different link: not blocked
    locks.release(1)
    locks.release(0)


def test_held_context_manager(locks: PcieLocks) -> None:
    with locks.held(3, 5) as ok:
        assert ok
        assert locks.stats(3).holder_pid == os.getpid()
    assert locks.stats(3).holder_pid == 0
    with locks.held(3, LEVELS) as ok:  # bad level: fail open, run the block anyway
        assert not ok


def test_timeout_leaves_the_queue(locks: PcieLocks, path: Path, tmp_path: Path) -> None:
    locks.acquire(0, 0)
    with pytest.raises(PcieLockError) as e:
        locks.acquire(0, 7, timeout=0.05)  # we hold it: our own waiter times out
    assert e.value.errno == errno.ETIMEDOUT
    assert sum(locks.stats(0).waiters) == 0
    out = tmp_path / "order"
    procs = _queue(locks, path, 0, [1], out)
    locks.release(0)
    _join_ok(*procs)
    assert _order(out) == ["0:1"]


# ---- robustness -------------------------------------------------------------------------


def test_killed_holder_is_recovered(locks: PcieLocks, path: Path) -> None:
    child = _start(_hold_forever, path, 0)
    wait_for("child holds", lambda: locks.stats(0).holder_pid == child.pid, DEADLINE, 0.005)
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)  # not reaped yet: a zombie must count as dead too
    locks.acquire(0, 0, timeout=DEADLINE)
    st0 = locks.stats(0)
    assert st0.holder_pid == os.getpid()
    assert st0.recovered == 1
    locks.release(0)
    child.join(DEADLINE)


def test_killed_waiter_does_not_block_later_waiters(locks: PcieLocks, path: Path,
                                                    tmp_path: Path) -> None:
    out = tmp_path / "order"
    locks.acquire(0, 0)
    high, low = _queue(locks, path, 0, [5, 0], out)
    assert high.pid is not None
    os.kill(high.pid, signal.SIGKILL)  # the best waiter dies queued
    high.join(DEADLINE)
    locks.release(0)  # no stats() in between: the live waiter itself must purge the dead one
    _join_ok(low)
    assert _order(out) == ["1:0"]
    assert locks.stats(0).recovered == 1


def test_killed_while_holding_internal_mutex(locks: PcieLocks, path: Path) -> None:
    ready = CTX.Event()
    child = _start(_lock_internal_forever, path, 1, ready)
    assert ready.wait(DEADLINE)
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    child.join(DEADLINE)
    locks.acquire(1, 2, timeout=DEADLINE)  # EOWNERDEAD -> consistent + repair
    st1 = locks.stats(1)
    assert st1.repairs == 1 and st1.holder_pid == os.getpid()
    locks.release(1)


def _stress(path: Path, counter: Path, iters: int, rank: int) -> None:
    lk = PcieLocks.open(path)
    fd = os.open(counter, os.O_RDWR)
    m = mmap.mmap(fd, 8)
    for i in range(iters):
        lk.acquire(0, (rank + i) % 3, timeout=DEADLINE)
        (v,) = struct.unpack_from("<q", m, 0)  # non-atomic read-modify-write
        v = v + 1 if v >= 0 else v
        struct.pack_into("<q", m, 0, v)
        lk.release(0)


def test_mutual_exclusion_stress(locks: PcieLocks, path: Path, tmp_path: Path) -> None:
    procs_n, iters = 4, 500
    counter = tmp_path / "counter"
    counter.write_bytes(bytes(8))
    procs = [_start(_stress, path, counter, iters, r) for r in range(procs_n)]
    _join_ok(*procs)
    assert struct.unpack("<q", counter.read_bytes())[0] == procs_n * iters
    st0 = locks.stats(0)
    assert st0.grants == procs_n * iters and st0.holder_pid == 0
    assert sum(st0.waiters) == 0 and st0.recovered == 0


def _churn_forever(path: Path) -> None:
    lk = PcieLocks.open(path)
    while True:
        lk.acquire(0, 7, timeout=DEADLINE)
        lk.release(0)


def test_killed_under_contention(locks: PcieLocks, path: Path, tmp_path: Path) -> None:
    """A high-level process dies at an arbitrary point (holding, queued or inside the internal
    mutex) while others hammer the link: the others all finish."""
    counter = tmp_path / "counter"
    counter.write_bytes(bytes(8))
    victim = _start(_churn_forever, path)
    wait_for("victim running", lambda: locks.stats(0).grants > 200, DEADLINE, 0.005)
    workers = [_start(_stress, path, counter, 300, r) for r in range(2)]
    wait_for("workers running",
             lambda: struct.unpack("<q", counter.read_bytes())[0] > 50, DEADLINE, 0.005)
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    _join_ok(*workers)
    victim.join(DEADLINE)
    assert struct.unpack("<q", counter.read_bytes())[0] == 600
    locks.acquire(0, 0, timeout=DEADLINE)
    locks.release(0)


def test_queue_full(locks: PcieLocks) -> None:
    locks.acquire(0, 0)
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            locks.acquire(0, 1, timeout=DEADLINE)  # same pid: any thread may release
            locks.release(0)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=waiter) for _ in range(QUEUE_LEN)]
    for t in threads:
        t.start()
    wait_for("queue full", lambda: sum(locks.stats(0).waiters) == QUEUE_LEN, DEADLINE, 0.005)
    with pytest.raises(PcieLockError) as e:
        locks.acquire(0, 7)
    assert e.value.errno == errno.ENOSPC
    locks.release(0)
    for t in threads:
        t.join(DEADLINE)
    assert not errors
    assert locks.stats(0).grants == QUEUE_LEN + 1


# ---- bad inputs -------------------------------------------------------------------------


def test_bad_link_and_level(locks: PcieLocks) -> None:
    for link, level in [(4, 0), (1000, 0), (-1, 0), (0, LEVELS), (0, -1), (0, 2**40)]:
        with pytest.raises(PcieLockError) as e:
            locks.acquire(link, level)
        assert e.value.errno == errno.EINVAL
    with pytest.raises(PcieLockError) as e:
        locks.release(0)  # not the holder
    assert e.value.errno == errno.EPERM
    with pytest.raises(PcieLockError):
        locks.stats(4)
    with pytest.raises(PcieLockError):
        PcieLocks.create(locks.path.with_name("zero"), 0)


def test_release_by_other_process_refused(locks: PcieLocks, path: Path) -> None:
    locks.acquire(0, 0)

    def other() -> None:
        try:
            PcieLocks.open(path).release(0)
        except PcieLockError as e:
            os._exit(0 if e.errno == errno.EPERM else 3)
        os._exit(4)

    _join_ok(_start(other))
    assert locks.stats(0).holder_pid == os.getpid()
    locks.release(0)


def _corrupt(good: bytes) -> dict[str, bytes]:
    return {
        "empty": b"",
        "garbage": os.urandom(len(good)),
        "zeros": bytes(len(good)),
        "short header": good[:32],
        "truncated": good[: len(good) // 2],
        "too long": good + bytes(64),
        "wrong version": good[:8] + struct.pack("<I", 99) + good[12:],
        "wrong link size": good[:16] + struct.pack("<I", 1) + good[20:],
        "wrong link count": good[:20] + struct.pack("<I", 5) + good[24:],
    }


def test_bad_files_fail_cleanly(path: Path, tmp_path: Path) -> None:
    good = path.read_bytes()
    for name, data in _corrupt(good).items():
        bad = tmp_path / name.replace(" ", "_")
        bad.write_bytes(data)
        with pytest.raises(PcieLockError) as e:
            PcieLocks.open(bad)
        assert e.value.errno == errno.EINVAL, name
        assert PcieLocks.try_open(bad) is None
    with pytest.raises(PcieLockError) as e:
        PcieLocks.open(tmp_path / "missing")
    assert e.value.errno == errno.ENOENT
    with pytest.raises(PcieLockError):
        PcieLocks.open(tmp_path)  # a directory
    assert PcieLocks.try_open(tmp_path / "missing") is None


def test_create_replaces_and_sets_mode(tmp_path: Path) -> None:
    p = tmp_path / "pcie"
    PcieLocks.create(p, 2).close()
    with PcieLocks.create(p, 3) as lk:
        assert lk.links == 3
    assert p.stat().st_mode & 0o777 == 0o660
    assert sorted(x.name for x in tmp_path.iterdir()) == ["pcie"]  # no temp file left


def test_library_loads() -> None:
    assert load_library() is load_library()


# ---- topology (a fake sysfs tree: this machine has no GPUs) -----------------------------


def _dev(root: Path, chain: list[str], vendor: int, cls: int) -> None:
    d = root / "devices" / "pci0000:00"
    for bdf in chain:
        d = d / bdf
    d.mkdir(parents=True)
    (d / "vendor").write_text(f"0x{vendor:04x}\n")
    (d / "class").write_text(f"0x{cls:06x}\n")
    link = root / "bus" / "pci" / "devices" / chain[-1]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(d, link.parent))


def test_shared_links_fake_sysfs(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    rp, up = "0000:00:01.0", "0000:01:00.0"  # root port, switch upstream port
    # switch A: GPU and NIC on two downstream ports -> shared
    _dev(root, [rp, up, "0000:02:00.0", "0000:03:00.0"], 0x10DE, 0x030200)
    _dev(root, [rp, up, "0000:02:01.0", "0000:04:00.0"], 0x15B3, 0x020000)
    _dev(root, [rp, up, "0000:02:02.0", "0000:05:00.0"], 0x10DE, 0x030000)
    # switch B: two GPUs, no NIC -> not shared
    rp2, up2 = "0000:00:02.0", "0000:11:00.0"
    _dev(root, [rp2, up2, "0000:12:00.0", "0000:13:00.0"], 0x10DE, 0x030200)
    _dev(root, [rp2, up2, "0000:12:01.0", "0000:14:00.0"], 0x10DE, 0x030200)
    # root port C: an InfiniBand NIC and a GPU right under it -> shared
    _dev(root, ["0000:00:03.0", "0000:21:00.0"], 0x15B3, 0x020700)
    _dev(root, ["0000:00:03.0", "0000:21:00.1"], 0x10DE, 0x030200)
    # a non-NVIDIA GPU and an NVMe drive next to a NIC: neither counts
    _dev(root, ["0000:00:04.0", "0000:31:00.0"], 0x1002, 0x030000)
    _dev(root, ["0000:00:04.0", "0000:31:00.1"], 0x144D, 0x010802)
    _dev(root, ["0000:00:04.0", "0000:31:00.2"], 0x8086, 0x020000)
    # an unreadable class: skipped
    (root / "bus" / "pci" / "devices" / "0000:99:00.0").mkdir()
    links = shared_links(root)
    assert [(s.bridge, s.gpus, s.nics) for s in links] == [
        ("0000:00:03.0", ("0000:21:00.1",), ("0000:21:00.0",)),
        ("0000:01:00.0", ("0000:03:00.0", "0000:05:00.0"), ("0000:04:00.0",)),
    ]
    assert shared_links(tmp_path / "nothing") == []


def test_agent_makes_one_semaphore_per_shared_switch_and_keeps_it(tmp_path: Path) -> None:
    from cruxd.agent.dataplane import DataPlane

    root = tmp_path / "sys"
    _dev(root, ["0000:00:03.0", "0000:21:00.0"], 0x15B3, 0x020700)  # NIC + GPU, one port
    _dev(root, ["0000:00:03.0", "0000:21:00.1"], 0x10DE, 0x030200)
    dp = DataPlane(tmp_path / "decisions", sysfs_root=str(root))
    dp.start()
    assert dp.pcie_links == 1
    with PcieLocks.open(dp.pcie_path) as lk:
        assert lk.links == 1
        lk.acquire(0, 5)  # a job holds the link while the agent restarts
        inode = dp.pcie_path.stat().st_ino
        DataPlane(tmp_path / "decisions", sysfs_root=str(root)).start()
        assert dp.pcie_path.stat().st_ino == inode  # same file: the holder is not orphaned
        lk.release(0)
    dp.pcie_path.write_bytes(b"garbage")  # an invalid file is replaced
    DataPlane(tmp_path / "decisions", sysfs_root=str(root)).start()
    with PcieLocks.open(dp.pcie_path) as lk:
        assert lk.links == 1
