"""The wrapper's PCIe gate (shim/crux_gate.c) without a NIC: tests/c/gate_drive.c gives the
gate a fake device context whose ops table it swaps as it would a provider's, so posts and
polls go through the real trampolines, the real semaphore file and the real map file. Several
drivers are separate processes, as jobs are.

A post the gate makes wait is seen waiting in the semaphore's own queue; every wait for a state
is a bounded poll with a generous deadline: no test asserts on how fast anything is.
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cruxd.testing import wait_for
from tests.cbuild import build
from tests.test_pcie_links import GATE_SOURCES
from transport.pcie import LEASE_ENV, PcieLocks
from transport.pcie_links import DeviceLink, LinkMap, write_map

DEADLINE = 30.0
LINK = 1  # mlx5_0's link in the map below
UNGATED = {"error": 0, "timeout": 1, "self": 2, "untracked": 3}


class Drive:
    """One gate_drive process: a job with one fake device context."""

    def __init__(self, prog: Path, tmp: Path, level: int, *, device: str = "mlx5_0",
                 pcie: Path | None = None, links: Path | None = None, quantum_us: int = 1000,
                 max_wait_ms: int = 30000, records: Path | None = None) -> None:
        """records: count traffic into a QP records file there (tests/test_qp_counters.py)."""
        args = [str(prog), str(pcie or tmp / "pcie"), str(links or tmp / "pcie-links"),
                str(level), device, str(quantum_us), str(max_wait_ms),
                *([str(records)] if records else [])]
        self.log = tmp / f"drive-{time.monotonic_ns()}.log"
        with open(self.log, "w") as err:
            self.p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=err, text=True, bufsize=1)
        self.pid = self.p.pid

    def send(self, line: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def answered(self) -> bool:
        assert self.p.stdout is not None
        return bool(select.select([self.p.stdout], [], [], 0)[0])

    def answer(self) -> str:
        assert self.p.stdout is not None
        ready = select.select([self.p.stdout], [], [], DEADLINE)[0]
        assert ready, f"no answer in {DEADLINE} s"
        return self.p.stdout.readline().strip()

    def __call__(self, *lines: str) -> None:
        for line in lines:
            self.send(line)
            assert self.answer() == "ok", line

    def stats(self) -> dict[str, object]:
        self.send("stats")
        return json.loads(self.answer())  # type: ignore[no-any-return]

    def ungated(self, why: str) -> int:
        return self.stats()["ungated"][UNGATED[why]]  # type: ignore[index, no-any-return]

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=DEADLINE)


@pytest.fixture(scope="module")
def prog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("cbin"), "gate_drive", GATE_SOURCES, "-pthread")


def drives(prog: Path, tmp_path: Path, links: tuple[DeviceLink, ...]
           ) -> Iterator[Callable[..., Drive]]:
    """A semaphore file with two links and a map of `links`; yields a factory of drivers
    (a level, and keywords for Drive), all killed at the end."""
    PcieLocks.create(tmp_path / "pcie", 2).close()
    write_map(tmp_path / "pcie-links", LinkMap(2, links))
    made: list[Drive] = []

    def make(level: int, **kw: object) -> Drive:
        made.append(Drive(prog, tmp_path, level, **kw))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for d in made:
        d.close()


@pytest.fixture
def rig(prog: Path, tmp_path: Path) -> Iterator[Callable[..., Drive]]:
    """mlx5_0, mlx5_1 on link 1; rxe0 on 0 (drives)."""
    yield from drives(prog, tmp_path, (DeviceLink("mlx5_0", 1, None),
                                       DeviceLink("mlx5_1", 1, None),
                                       DeviceLink("rxe0", 0, None)))


@pytest.fixture
def sem(tmp_path: Path, rig: object) -> Iterator[PcieLocks]:
    with PcieLocks.open(tmp_path / "pcie") as lk:
        yield lk


def test_holds_the_link_while_signaled_work_is_outstanding(rig: Callable[..., Drive],
                                                           sem: PcieLocks) -> None:
    d = rig(3)
    d("qp 0", "qp 1", "post 0 2")
    assert sem.stats(LINK).holder_pid == d.pid and sem.stats(LINK).holder_level == 3
    d("post 1 1", "done 0 2")
    assert sem.stats(LINK).holder_pid == d.pid  # QP 1 still has a write in flight
    d("done 1 1")
    assert sem.stats(LINK).holder_pid == 0
    s = d.stats()
    assert (s["acquires"], s["releases"], s["waits"], s["yields"]) == (1, 1, 0, 0)
    assert s["contexts"]["gated"] == 1  # type: ignore[index]


def test_unsignaled_work_rides_along_and_sq_sig_all_counts(rig: Callable[..., Drive],
                                                           sem: PcieLocks) -> None:
    d = rig(3)
    d("qp 0", "post 0 0 3")
    assert sem.stats(LINK).holder_pid == 0  # nothing it would ever be told completed
    d("qp 1 all", "post 1 0 2")  # unsignaled flags, but the QP signals every WR
    assert sem.stats(LINK).holder_pid == d.pid
    d("done 1 1")
    assert sem.stats(LINK).holder_pid == d.pid
    d("done 1 1")
    assert sem.stats(LINK).holder_pid == 0


def test_receives_do_not_count_errors_do_and_destroy_or_refusal_idles(
        rig: Callable[..., Drive], sem: PcieLocks) -> None:
    d = rig(3)
    d("qp 0", "post 0 2", "recv 0 5")
    assert sem.stats(LINK).holder_pid == d.pid  # the peer's writes are not our traffic
    d("err 0 1")
    assert sem.stats(LINK).holder_pid == d.pid
    d("err 0 5")  # a flush reports unsignaled WRs too: clamped at zero
    assert sem.stats(LINK).holder_pid == 0
    d("post 0 3", "destroy 0")  # completions that will never be polled
    assert sem.stats(LINK).holder_pid == 0
    d("qp 1", "fail 1 2")  # the provider refused the WRs: they never complete
    assert sem.stats(LINK).holder_pid == 0
    s = d.stats()
    assert (s["acquires"], s["releases"]) == (3, 3)


def test_lower_level_waits_inside_post_while_the_higher_is_active(
        rig: Callable[..., Drive], sem: PcieLocks, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LEASE_ENV, "0")  # hi waits for lo's next post, however late it comes
    lo, hi = rig(1), rig(5)
    lo("qp 0", "post 0 1")
    hi("qp 0")
    hi.send("post 0 1")  # the link is lo's: hi queues at its level
    wait_for("hi queued", lambda: sem.stats(LINK).waiters[5] == 1, DEADLINE, 0.005)
    assert not hi.answered()
    lo.send("post 0 1")  # lo's next post sees a higher level waiting and yields
    assert hi.answer() == "ok"
    wait_for("lo queued behind hi", lambda: sem.stats(LINK).waiters[1] == 1, DEADLINE, 0.005)
    assert sem.stats(LINK).holder_pid == hi.pid
    hi("post 0 4", "done 0 3")  # a lower waiter never makes the holder yield
    assert sem.stats(LINK).holder_pid == hi.pid and not lo.answered()
    hi("done 0 2")  # hi drains: the link goes to lo, whose post returns
    assert lo.answer() == "ok"
    assert sem.stats(LINK).holder_pid == lo.pid
    assert (lo.stats()["yields"], lo.stats()["waits"], hi.stats()["waits"]) == (1, 1, 1)
    lo("done 0 2")
    assert sem.stats(LINK).holder_pid == 0


def test_equal_levels_take_turns_after_the_quantum(rig: Callable[..., Drive], sem: PcieLocks,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LEASE_ENV, "0")  # the quantum alone ends turns here, not the lease
    patient, b = rig(3, quantum_us=10**8), rig(3)
    patient("qp 0", "post 0 1")
    b("qp 0")
    b.send("post 0 1")
    wait_for("b queued", lambda: sem.stats(LINK).waiters[3] == 1, DEADLINE, 0.005)
    patient("post 0 1")  # its quantum (100 s) is far from over: it keeps the link
    assert sem.stats(LINK).holder_pid == patient.pid
    patient("done 0 2")
    assert b.answer() == "ok"
    eager = rig(3, quantum_us=0)  # every equal waiter ends its turn at once
    eager("qp 0")
    eager.send("post 0 1")
    wait_for("eager queued", lambda: sem.stats(LINK).waiters[3] == 1, DEADLINE, 0.005)
    time.sleep(0.01)  # at least b's quantum (1 ms) since it took the link
    b.send("post 0 1")  # b yields at this post
    assert eager.answer() == "ok"
    wait_for("b queued behind eager", lambda: sem.stats(LINK).waiters[3] == 1, DEADLINE, 0.005)
    eager.send("post 0 1")  # and eager hands it straight back
    assert b.answer() == "ok"
    b("done 0 2")
    assert eager.answer() == "ok"
    assert b.stats()["yields"] == 1 and eager.stats()["yields"] == 1


def test_a_killed_holder_lets_the_waiter_through(rig: Callable[..., Drive],
                                                 sem: PcieLocks) -> None:
    hi, lo = rig(5), rig(1)
    hi("qp 0", "post 0 8")
    lo("qp 0")
    lo.send("post 0 1")
    wait_for("lo queued", lambda: sem.stats(LINK).waiters[1] == 1, DEADLINE, 0.005)
    hi.p.send_signal(signal.SIGKILL)  # mid-transfer, holding the link; not reaped yet
    assert lo.answer() == "ok"
    assert sem.stats(LINK).holder_pid == lo.pid and sem.stats(LINK).recovered >= 1


def test_timeouts_and_self_holds_go_ungated(rig: Callable[..., Drive], sem: PcieLocks) -> None:
    sem.acquire(LINK, 7)  # another job holds the link (this test process)
    d = rig(3, max_wait_ms=1)
    d("qp 0", "post 0 1", "post 0 1")  # each gives up after 1 ms and posts ungated
    assert d.ungated("timeout") == 2 and d.stats()["acquires"] == 0
    sem.release(LINK)
    own = rig(3)
    own.send("hold 1")  # the job itself holds the link outside the gate
    assert own.answer() == "ok 0"
    own("qp 0", "post 0 1")  # acquiring would wait for itself: go ungated instead
    assert own.ungated("self") == 1


def _corrupt(tmp: Path) -> None:
    (tmp / "pcie").write_bytes(b"\0" * 4096)


def _bad_map(tmp: Path) -> None:
    (tmp / "pcie-links").write_bytes(b"crux-pcie-links 1 2\nmlx5_0 9 -\n")


def _map_for_another_file(tmp: Path) -> None:
    write_map(tmp / "pcie-links", LinkMap(3, (DeviceLink("mlx5_0", 1, None),)))


def _keep(tmp: Path) -> None:
    pass


# case: (the reason counted, what to spoil, driver arguments)
FAIL_OPEN: dict[str, tuple[str, Callable[[Path], None], dict[str, object]]] = {
    "no semaphore file": ("no-semaphore", lambda t: (t / "pcie").unlink(), {}),
    "corrupt semaphore file": ("bad-semaphore", _corrupt, {}),
    "no map": ("no-map", lambda t: (t / "pcie-links").unlink(), {}),
    "bad map": ("bad-map", _bad_map, {}),
    "map of another semaphore file": ("bad-map", _map_for_another_file, {}),
    "device on no shared link": ("not-shared", _keep, {"device": "mlx5_9"}),
    "no level": ("no-level", _keep, {"level": -1}),
    "disabled": ("disabled", _keep, {"pcie": Path("off")}),
}


@pytest.mark.parametrize("case", FAIL_OPEN)
def test_fails_open(rig: Callable[..., Drive], tmp_path: Path, case: str) -> None:
    why, spoil, kw = FAIL_OPEN[case]
    args = {"level": 3, **kw}
    with PcieLocks.open(tmp_path / "pcie") as holder:
        holder.acquire(LINK, 7)  # gated, the post would wait for this forever
        spoil(tmp_path)
        d = rig(**args)
        d("qp 0", "post 0 1", "done 0 1")
        s = d.stats()
        assert s["contexts"][why] == 1 and s["acquires"] == 0, s  # type: ignore[index]


def test_a_context_is_looked_at_again_and_older_qps_stay_untracked(
        rig: Callable[..., Drive], tmp_path: Path) -> None:
    (tmp_path / "pcie").rename(tmp_path / "later")
    d = rig(3)
    d("qp 0")  # no semaphore file yet: ungated, looked at again after a second
    (tmp_path / "later").rename(tmp_path / "pcie")
    time.sleep(1.1)
    d("qp 1", "post 0 1", "post 1 1")
    s = d.stats()
    assert s["contexts"] == {**s["contexts"], "no-semaphore": 1, "gated": 1}  # type: ignore
    assert s["acquires"] == 1 and s["ungated"][UNGATED["untracked"]] == 1  # type: ignore
