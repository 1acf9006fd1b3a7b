"""PCIe gating on real verbs: two jobs share one configured PCIe link on the soft-RoCE rig.

Needs rxe0 on veth0 (10.77.0.1) and rxe1 on veth1 (10.77.0.2), RoCEv2 GID index 1, which
tests/rig/rxe_vm.py builds in a VM on kernels without RDMA (tests/test_rxe_vm.py runs this
file there). Each job is tests/c/rdma_stream.c loading the wrapper libibverbs the NCCL way and
streaming RDMA WRITEs from rxe0 to rxe1; the map puts both devices on link 0 of a semaphore
file, and the decision table gives "lo" plan level 1 and "hi" level 5.

The floors are the issue's: while hi streams, lo completes under 10 % of its standalone rate
(what it completes is one WR per CRUX_PCIE_MAX_WAIT_MS, 100 ms, posted ungated: issue 37);
after hi stops, lo is back at 90 % or more (within three rounds: see the test); SIGKILL of hi
mid-transfer lets lo resume within 1 s. Rates are lo's own, measured in the same run: "during"
over the whole of hi's run (every byte counts), "standalone" and "after" as the median of the
1-s rates over 5 s, so neither the VM's speed (qemu TCG) nor a busy second on the host running
it decides the outcome.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from tests.cbuild import build
from transport import native
from transport.decision_table import Decision, TableWriter
from transport.pcie import PcieLocks
from transport.pcie_links import DeviceLink, LinkMap, write_map

pytestmark = pytest.mark.rdma

SYS = Path("/sys/class/infiniband")
LO_LEVEL, HI_LEVEL = 1, 5


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not ((SYS / "rxe0").exists() and (SYS / "rxe1").exists()):
        pytest.skip("needs the soft-RoCE rig (rxe0, rxe1; tests/rig/rxe_vm.py builds it, "
                    "tests/test_rxe_vm.py runs this file there)")
    return build(tmp_path_factory.mktemp("cbin"), "rdma_stream", ["tests/c/rdma_stream.c"],
                 "-pthread")


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Path]:
    """The agent's files for one shared link: semaphore, map, decision table. Jobs still
    running at the end (a failed test) are killed."""
    PcieLocks.create(tmp_path / "pcie", 1).close()
    write_map(tmp_path / "pcie-links",
              LinkMap(1, (DeviceLink("rxe0", 0, None), DeviceLink("rxe1", 0, None))))
    with TableWriter.open(tmp_path / "decisions", capacity=16) as w:
        w.apply([Decision("lo", None, LO_LEVEL, 10, 40, 0, 1),
                 Decision("hi", None, HI_LEVEL, 46, 184, 0, 1)], 1)
    yield tmp_path
    for job in Job.started:
        if job.p.poll() is None:
            job.p.kill()
            job.p.wait()
    Job.started.clear()


class Job:
    """One rdma_stream process; its reports (t, completed bytes) arrive on a thread."""

    started: ClassVar[list[Job]] = []

    def __init__(self, prog: Path, host: Path, job: str, seconds: float, report_ms: int = 20,
                 **env: str) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith("CRUX_")}
        env = {"NCCL_IBVERBS_LIB": str(native.library(native.IBVERBS)), "CRUX_JOB_ID": job,
               "CRUX_DECISION_TABLE": str(host / "decisions"), "CRUX_QP_DIR": str(host),
               "CRUX_SHIM_LOG": "1", **env}
        self.err = host / f"{job}-{time.monotonic_ns()}.err"
        with open(self.err, "w") as err:
            self.p = subprocess.Popen([str(prog), "--seconds", str(seconds), "--report-ms",
                                       str(report_ms)], env={**base, **env},
                                      stdout=subprocess.PIPE, stderr=err, text=True)
        Job.started.append(self)
        self.reports: list[tuple[float, int]] = []
        self.done: float | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            r = json.loads(line)
            if r.get("ready"):
                continue
            self.reports.append((r["t"], r["bytes"]))
            if r.get("done"):
                self.done = r["t"]

    def wait(self, timeout: float = 120) -> str:
        """Exit 0 expected; the shim's log lines."""
        assert self.p.wait(timeout=timeout) == 0, self.err.read_text()
        self._reader.join(timeout=10)
        return self.err.read_text()

    def bytes_at(self, t: float) -> int:
        return max((b for (rt, b) in self.reports if rt <= t), default=0)

    def rate(self, t0: float, t1: float) -> float:
        # (t0 + i + 1) - (t0 + i) may round to just under 1 (t0 = 127.097 gave 0.99999999998)
        assert t1 - t0 >= 1.0 - 1e-9, f"window too short: {t0:.2f}..{t1:.2f}"
        return (self.bytes_at(t1) - self.bytes_at(t0)) / (t1 - t0)

    def typical_rate(self, t0: float, t1: float) -> float:
        """The median of the 1-s rates in [t0, t1]: a second in which the host running the VM
        was busy elsewhere does not drag the whole window down."""
        return statistics.median(self.rate(t0 + i, t0 + i + 1) for i in range(int(t1 - t0)))

    def first_progress(self, after: float) -> float | None:
        base = self.bytes_at(after)
        return next((t for (t, b) in self.reports if t > after and b > base), None)


def _ready(job: Job) -> float:
    """When the job's first report came (it is connected and posting)."""
    end = time.monotonic() + 60
    while not job.reports:
        assert job.p.poll() is None and time.monotonic() < end, job.err.read_text()
        time.sleep(0.01)
    return job.reports[0][0]


def _stats(log: str) -> dict[str, float]:
    line = next(x for x in log.splitlines() if "pcie gate stats:" in x)
    return {k: float(v) for k, v in re.findall(r"([\w-]+)=([\d.]+)", line)}


def _round(stream: Path, host: Path, lo: Job) -> tuple[float, float, float, str]:
    """lo alone for 5 s, then hi streams 4 s, then lo alone 5 s: lo's standalone, during-hi
    and after-hi rates, and hi's log."""
    start = time.monotonic()
    time.sleep(5.2)
    standalone = lo.typical_rate(start, start + 5)
    hi = Job(stream, host, "hi", 4, report_ms=100)
    _ready(hi)
    hi_log = hi.wait()
    assert hi.done is not None
    busy_from = next(t for (t, b) in hi.reports if b > 0) + 0.5
    during = lo.rate(busy_from, hi.done - 0.3)  # every byte of the window, not a median
    time.sleep(max(0.0, hi.done + 5.7 - time.monotonic()))
    after = lo.typical_rate(hi.done + 0.5, hi.done + 5.5)
    return standalone, during, after, hi_log


def test_lower_priority_job_gives_the_link_to_the_higher_one(stream: Path, host: Path) -> None:
    """The host running the VM is shared: with lo alone its rate drifts by 15 % and more over
    tens of seconds (seen on this rig). So a round whose recovery misses the floor is run
    again, up to three rounds, each against the standalone rate just before it; the 'during'
    floor must hold in every round."""
    lo = Job(stream, host, "lo", 600, report_ms=100)
    _ready(lo)
    rounds = []
    for _ in range(3):
        standalone, during, after, hi_log = _round(stream, host, lo)
        rounds.append(f"standalone {standalone / 1e6:.1f} MB/s, during hi "
                      f"{during / 1e6:.2f} MB/s, after {after / 1e6:.1f} MB/s")
        print(rounds[-1])  # shown with -rA: the margins over the floors
        assert standalone > 0 and during < 0.10 * standalone, rounds
        if after >= 0.90 * standalone:
            break
    else:
        raise AssertionError(f"lo never got back to 90 % of standalone: {rounds}")
    lo.p.send_signal(signal.SIGTERM)
    lo_log = lo.wait()
    lo_s, hi_s = _stats(lo_log), _stats(hi_log)
    assert "pcie gate rxe0: gated, link 0 level 1" in lo_log, lo_log
    assert "pcie gate rxe0: gated, link 0 level 5" in hi_log, hi_log
    assert lo_s["yields"] >= 1 and lo_s["waits"] >= 1, lo_log  # it yielded, then waited
    assert hi_s["waits"] >= 1 and hi_s["yields"] == 0, hi_log  # it never gave the link up
    # Since issue 37 a post waits at most CRUX_PCIE_MAX_WAIT_MS (100 ms), then goes ungated:
    # one 64 KiB WR per 100 ms (0.65 MB/s, inside the floor above) is all lo may post past hi.
    assert all(v == 0 for k, v in lo_s.items()
               if k.startswith("ungated") and k != "ungated-timeout"), lo_log


def test_killed_higher_priority_job_releases_the_link(stream: Path, host: Path) -> None:
    lo = Job(stream, host, "lo", 12)
    _ready(lo)
    time.sleep(1)
    hi = Job(stream, host, "hi", 60)
    _ready(hi)
    with PcieLocks.open(host / "pcie") as sem:  # hi holds the link, lo waits for it
        end = time.monotonic() + 30
        while not (sem.stats(0).holder_pid == hi.p.pid and sem.stats(0).waiters[LO_LEVEL]):
            assert time.monotonic() < end, "hi never took the link from lo"
            time.sleep(0.01)
    time.sleep(1)
    killed = time.monotonic()
    hi.p.send_signal(signal.SIGKILL)  # mid-transfer, holding the link; left unreaped a while
    lo.wait()
    hi.p.wait()
    resumed = lo.first_progress(killed)
    assert resumed is not None, lo.reports[-5:]
    print(f"lo resumed {resumed - killed:.3f} s after hi's SIGKILL")
    assert resumed - killed < 1.0, f"lo resumed {resumed - killed:.3f} s after the kill"


@pytest.mark.parametrize("case", ["no semaphore file", "corrupt semaphore file", "corrupt map"])
def test_jobs_fail_open(stream: Path, host: Path, case: str) -> None:
    env, why = {"no semaphore file": ({"CRUX_PCIE": str(host / "none")}, "no-semaphore"),
                "corrupt semaphore file": ({"CRUX_PCIE": str(host / "junk")}, "bad-semaphore"),
                "corrupt map": ({"CRUX_PCIE_LINKS": str(host / "junk")}, "bad-map")}[case]
    (host / "junk").write_bytes(os.urandom(8192))
    with PcieLocks.open(host / "pcie") as sem:
        sem.acquire(0, 7)  # the real link is busy: a gated job could not move at all
        job = Job(stream, host, "lo", 2, **env)
        t0 = _ready(job)
        log = job.wait()
        assert job.done is not None and job.rate(t0, job.done) > 0
    assert f"pcie gate rxe0: {why}" in log, log
    assert _stats(log)[why] == 2 and _stats(log)["acquires"] == 0, log  # rxe0 and rxe1


# --- issue 37, item 2: a member of the semaphore file attacks a real job's posts ------------

ATTACKER = ("import os, signal, sys\n"
            "from transport.pcie import PcieLocks\n"
            "PcieLocks.open(sys.argv[1])._test_lock_internal(0)\n"
            "print('locked', flush=True)\n"
            "os.kill(os.getpid(), signal.SIGSTOP)\n")


def test_a_member_stopped_inside_the_link_lock_does_not_stop_a_job(stream: Path,
                                                                   host: Path) -> None:
    """It takes link 0's internal mutex and stops itself: the job's posts used to wait on that
    mutex for ever; now each one waits 2 ms at most, then the link goes ungated for 100 ms."""
    attacker = subprocess.Popen([sys.executable, "-c", ATTACKER, str(host / "pcie")],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert attacker.stdout is not None and attacker.stdout.readline().strip() == "locked"
        end = time.monotonic() + 10
        while Path(f"/proc/{attacker.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] \
                not in ("T", "t"):
            assert time.monotonic() < end, "the attacker did not stop"
            time.sleep(0.01)
        hi = Job(stream, host, "hi", 2)
        t0 = _ready(hi)
        log = hi.wait(timeout=60)
        assert hi.done is not None and hi.rate(t0, hi.done) > 0, log
        assert _stats(log)["ungated-error"] >= 1, log  # EBUSY: posted ungated, counted
    finally:
        attacker.kill()
        attacker.wait()


def test_a_low_holder_that_never_releases_loses_the_link_to_a_higher_job(stream: Path,
                                                                        host: Path) -> None:
    """A level-0 member takes link 0 and keeps it: a level-5 job's posts used to wait the
    gate's whole 10 s each; now the hold ends after the 20 ms lease and the job takes it."""
    with PcieLocks.open(host / "pcie") as sem:
        sem.acquire(0, 0)
        hi = Job(stream, host, "hi", 2)
        t0 = _ready(hi)
        log = hi.wait(timeout=60)
        assert hi.done is not None and hi.rate(t0, hi.done) > 0, log
        stats = _stats(log)
        assert stats["acquires"] >= 1 and stats["ungated-timeout"] == 0, log
        assert sem.stats(0).expired >= 1  # the lease ended the level-0 hold

