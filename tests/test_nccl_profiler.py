"""libcrux_nccl_profiler.so driven through NCCL's profiler ABI, without NCCL or a GPU.

shim/bench/nccl_harness.c opens the installed plugin the way NCCL opens NCCL_PROFILER_PLUGIN,
looks its struct up the way a given NCCL release does (newest version first), and plays a
script of events shaped like NCCL's: collective, then its proxy ops on several channels,
each with its steps (start, SendWait with the size, stop). The record it leaves is read by
the agent's own reader and estimator.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from bench._make import BUILD, ensure_built
from cruxd.agent.dataplane import DataPlane
from cruxd.agent.measuring import LiveMeasurement
from cruxd.agent.process_tree import belongs
from cruxd.cli.status_view import _nccl_profilers
from cruxd.control.records import HostPlan, JobAssignment, JobState, LocalJob, Measurement
from cruxd.measure.estimate import estimate_job
from cruxd.measure.sampling.nccl_figures import NcclFigures
from tests.test_live_measurement import FIXTURE, config, feed
from transport import native
from transport.nccl_records import BURSTS, NcclRecord, parse, read_dir

# what each NCCL release looks up first (docs/nccl-profiler-abi.md, section 1)
RELEASES = {"2.23": 1, "2.24": 2, "2.25": 2, "2.26": 3, "2.27": 4, "2.28": 5, "2.29": 6,
            "2.30": 6}


@pytest.fixture(scope="module")
def harness() -> Path:
    return ensure_built(BUILD / "nccl_harness", "nccl")


@pytest.fixture(scope="module")
def echo() -> Path:
    return ensure_built(BUILD / "libnccl-profiler-echo.so", "nccl")


def drive(harness: Path, script: str, release: str, qdir: Path, job: str = "j",
          **env: str) -> subprocess.CompletedProcess[str]:
    """Plays `script` through the installed plugin, opened by its bare name on
    LD_LIBRARY_PATH as crux-run has NCCL open it."""
    plugin = native.library(native.NCCL_PROFILER)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CRUX_", "NCCL_"))}
    return subprocess.run([str(harness), plugin.name, release], input=script, text=True,
                          capture_output=True, timeout=60,
                          env={**base, "LD_LIBRARY_PATH": str(plugin.parent),
                               "CRUX_QP_DIR": str(qdir), "CRUX_JOB_ID": job, **env})


def one_collective(hash_: int = 77, size: int = 4000) -> str:
    return "\n".join([
        f"init 0 8 3 {hash_}", "event 0 9 1 -", "coll 0 1 9 AllReduce 1000 ncclFloat32",
        "stop 1", "stop 9", "op 0 2 1 1 4 1000 0", "step 0 3 2 0", f"state 3 9 {size}",
        "at 2000", "stop 3", "stop 2", "fin 0", ""])


def record_of(qdir: Path) -> NcclRecord:
    (path,) = qdir.glob("nccl-*")
    return parse(path.read_bytes())


@pytest.mark.parametrize("release", RELEASES)
def test_each_nccl_release_finds_its_newest_version(harness: Path, tmp_path: Path,
                                                    release: str) -> None:
    r = drive(harness, one_collective(), release, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"api {RELEASES[release]} name crux")
    assert "mask 0x1e" in r.stdout  # collectives, p2p, proxy ops and steps: nothing more
    rec = record_of(tmp_path)
    assert rec.api_version == RELEASES[release] and rec.job_id == "j"
    (comm,) = rec.comms
    assert comm.comm_hash == 77 and not comm.live  # finalised
    assert comm.nranks == (8 if RELEASES[release] >= 4 else 0)  # v1-v3: no init arguments
    assert comm.func_colls["allreduce"] == comm.colls == 1
    (b,) = comm.bursts
    assert b["bytes"] == 4000 and b["colls"] == 1 and b["ops"] == 1
    assert b["sent_bytes"] == 4000  # v4+: the step's size; v1-v3: nSteps x chunkSize
    # from the SendWait state to the step's stop, which waits for 2 ms into the script
    assert 0 < b["busy_ns"] == b["end_ns"] - b["start_ns"] < 200_000_000


def union(intervals: Sequence[tuple[float, float]]) -> float:
    total, end = 0.0, -1.0
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def job_script(period_s: float, bursts: Sequence[tuple[float, float]], seconds: float,
               hold_s: float) -> tuple[str, list[tuple[float, float]]]:
    """A rank's NCCL events over `seconds`: per iteration, each burst (offset, duration) is one
    AllReduce on two channels, four steps per channel; channel 1 finishes 0.2 ms later. Then
    finalize, and stay alive `hold_s`. Also the network intervals the script makes."""
    lines, spans, h = ["init 0 8 0 99"], [], 10
    iterations = int(seconds / period_s)
    for i in range(iterations):
        for off, dur in bursts:
            a = i * period_s + off
            coll, ops = h, (h + 1, h + 2)
            h += 3
            lines += [f"at {int((a - 0.001) * 1e6)}",
                      f"coll 0 {coll} - AllReduce 262144 ncclFloat32", f"stop {coll}"]
            lines += [f"op 0 {op} {coll} 1 4 262144 0" for op in ops]
            events = []
            for ch, op in enumerate(ops):
                late = 0.0002 * ch
                for s in range(4):
                    t0, t1 = a + dur * s / 4, a + dur * (s + 1) / 4 + (late if s == 3 else 0)
                    events += [(t0, f"step 0 {h} {op} {s}"), (t0, f"state {h} 9 262144"),
                               (t1, f"stop {h}")]
                    h += 1
                events.append((a + dur + late, f"stop {op}"))
                spans.append((a, a + dur + late))
            for t, line in sorted(events, key=lambda e: e[0]):
                lines += [f"at {int(t * 1e6)}", line]
    lines += ["fin 0", f"at {int((seconds + hold_s) * 1e6)}", ""]
    return "\n".join(lines), spans


def rates(spans: Sequence[tuple[float, float]], n: int, hz: float, level: float) -> np.ndarray:
    """What a NIC counter sampled at `hz` sees of these bursts (bytes/s per sample)."""
    out = np.zeros(n)
    for a, b in spans:
        for i in range(int(a * hz), min(n, int(b * hz) + 1)):
            lo, hi = max(a, i / hz), min(b, (i + 1) / hz)
            if hi > lo:
                out[i] += level * (hi - lo) * hz
    return out


@pytest.fixture
def two_jobs(harness: Path, tmp_path: Path) -> Iterator[tuple[dict[str, subprocess.Popen[str]],
                                                               dict[str, list[tuple[float,
                                                                                    float]]]]]:
    seconds, hold, read_at = 6.0, 8.0, 4.5  # read while both jobs still run
    shapes = {"a": (0.2, [(0.08, 0.03), (0.15, 0.025)]), "b": (0.33, [(0.2, 0.09)])}
    plugin = native.library(native.NCCL_PROFILER)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CRUX_", "NCCL_"))}
    procs, spans = {}, {}
    for job, (period, bursts) in shapes.items():
        script, spans[job] = job_script(period, bursts, seconds, hold)
        p = subprocess.Popen([str(harness), plugin.name, "2.30"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True,
                             env={**base, "LD_LIBRARY_PATH": str(plugin.parent),
                                  "CRUX_QP_DIR": str(tmp_path), "CRUX_JOB_ID": job})
        assert p.stdin is not None
        p.stdin.write(script)
        p.stdin.close()
        procs[job] = p
    try:
        time.sleep(read_at)
        yield procs, spans
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_two_jobs_on_one_nic_get_their_own_t_j_and_period(tmp_path: Path, two_jobs: tuple[
        dict[str, subprocess.Popen[str]], dict[str, list[tuple[float, float]]]]) -> None:
    procs, spans = two_jobs
    known = {j: (p, union(spans[j]) / int(6.0 / p)) for j, p in (("a", 0.2), ("b", 0.33))}
    owners = {job: (p.pid,) for job, p in procs.items()}
    m = LiveMeasurement(config(FIXTURE), (), lambda j: owners.get(j, ()), lambda: [],
                        lambda: 2, nccl=NcclFigures(tmp_path, lambda j: owners.get(j, ()),
                                                    belongs))
    # the NIC sees both jobs' bytes at once
    hz, n = 100.0, 400
    nic = rates(spans["a"], n, hz, 2e9) + rates(spans["b"], n, hz, 2e9)
    feed(m, {"net:eth0": nic}, hz)
    m.plan_changed(HostPlan("h0", 1, 0, 4, tuple(JobAssignment(j, JobState.PROFILING, level=3,
                                                                dscp=46) for j in known)))
    for t in m.tracks.values():
        t.profiling_since = time.monotonic() - 20
    got = {j: m.measure(LocalJob(j, 1), Measurement()) for j in known}
    for job, (period, t_j) in known.items():
        assert got[job].source == "nvml+nccl", got[job]
        assert got[job].period_s == pytest.approx(period, rel=0.02), job
        assert got[job].comm_s == pytest.approx(t_j, rel=0.02), job
        # two channels x four steps of 262,144 bytes per collective
        per_iter = len([s for s in spans[job] if s[0] < period]) / 2 * 2 * 4 * 262144
        assert got[job].allreduce_bytes == pytest.approx(per_iter, rel=0.1), job
    # counters alone: one series, one set of figures, wrong for at least one of the jobs
    mixed = estimate_job(nic, hz, [], [], set(), 0.02)
    assert mixed is not None
    assert any(abs(mixed.period_s / p - 1) > 0.02 or abs(mixed.comm_s / t - 1) > 0.02
               for p, t in known.values())
    # a record only claims its job: a process that is not the job's counts for nothing
    others = NcclFigures(tmp_path, lambda j: (1,), belongs)
    assert others.estimate("a", time.monotonic() - 10) is None
    # what `cruxctl status` shows of the plugin, per job
    dp = DataPlane(tmp_path / "decisions")
    dp.qp_dir = tmp_path
    rows = {r.job_id: r for r in dp.nccl_status()}
    assert sorted(rows) == ["a", "b"]
    for r in rows.values():
        assert (r.processes, r.api_version, r.communicators, r.chain, r.bad_events) == (
            1, 6, 1, "none", 0)
        assert r.collectives >= 10 and r.last_write_age_s < 1.0
    console = Console(width=200, record=True)
    console.print(_nccl_profilers(list(rows.values())))
    assert "v6" in console.export_text()


def test_a_chained_plugin_gets_every_event_with_its_own_handles(harness: Path, echo: Path,
                                                                tmp_path: Path) -> None:
    out = tmp_path / "echo.txt"
    qdir = tmp_path / "q"
    qdir.mkdir()
    r = drive(harness, one_collective(), "2.30", qdir, CRUX_NCCL_PROFILER_NEXT=str(echo),
              ECHO_OUT=str(out))
    assert r.returncode == 0, r.stderr
    # the mask NCCL uses is both plugins' (echo: collectives, groups, kernel channels)
    assert "mask 0x5f" in r.stdout
    # group, collective, proxy op, step: each started, stopped, its parent echo's own handle
    assert out.read_text() == "starts 4 stops 4 records 1 foreign 0 contexts 1\n"
    rec = record_of(qdir)
    assert rec.chain == "chained" and rec.chained == str(echo)
    assert rec.comms[0].bursts["bytes"].tolist() == [4000]
    # by the name NCCL would expand (libnccl-profiler-<name>.so), on LD_LIBRARY_PATH
    qdir2 = tmp_path / "q2"
    qdir2.mkdir()
    r = drive(harness, one_collective(), "2.28", qdir2, CRUX_NCCL_PROFILER_NEXT="echo",
              ECHO_OUT=str(out), LD_LIBRARY_PATH=f"{native.lib_dir()}:{echo.parent}")
    assert r.returncode == 0 and out.read_text().count("foreign 0") == 2, r.stderr


def test_a_chained_plugin_without_the_version_is_named_and_crux_still_records(
        harness: Path, echo: Path, tmp_path: Path) -> None:
    # echo exports v4-v6 only: NCCL 2.26 would use v3
    r = drive(harness, one_collective(), "2.26", tmp_path, CRUX_NCCL_PROFILER_NEXT=str(echo))
    assert r.returncode == 0
    assert f"cannot chain to profiler plugin {echo}" in r.stderr
    rec = record_of(tmp_path)
    assert rec.chain == "chain failed" and rec.comms[0].bursts.size == 1
    # nor does crux chain to itself
    r = drive(harness, one_collective(), "2.30", tmp_path / "x",
              CRUX_NCCL_PROFILER_NEXT=str(native.library(native.NCCL_PROFILER)))
    assert r.returncode == 0 and "cannot chain" in r.stderr


@pytest.mark.root
@pytest.mark.parametrize("plant", ["file", "symlink"])
def test_a_planted_record_name_is_refused_and_the_job_runs(harness: Path, tmp_path: Path,
                                                          plant: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the planted file belongs to another uid")
    plugin = native.library(native.NCCL_PROFILER)
    p = subprocess.Popen([str(harness), plugin.name, "2.30"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={"LD_LIBRARY_PATH": str(plugin.parent), "CRUX_QP_DIR": str(tmp_path),
                              "CRUX_JOB_ID": "j", "CRUX_SHIM_LOG": "1"})
    assert p.stdout is not None and p.stdin is not None
    pid = int(p.stdout.readline().split()[-1])
    name = tmp_path / f"nccl-{pid}"
    target = tmp_path / "victim"
    target.write_bytes(b"x" * 10)
    if plant == "file":
        name.write_bytes(b"planted")
        os.chown(name, 65534, 65534)
    else:
        name.symlink_to(target)
    out, err = p.communicate(one_collective(), timeout=30)
    assert p.returncode == 0 and out.endswith("done\n")
    assert "no record" not in err, err  # passed by: the next name (shim/crux_recfile.h)
    assert parse((tmp_path / f"nccl-{pid}.1").read_bytes()).pid == pid
    assert target.read_bytes() == b"x" * 10
    if plant == "file":
        assert name.read_bytes() == b"planted"


_IDS = st.integers(0, 12).map(str) | st.just("-")
_COMMANDS = st.one_of(
    st.builds(lambda c, n, r: f"init {c} {n} {r} 5", st.integers(0, 2), st.integers(-1, 9),
              st.integers(-1, 9)),
    st.builds(lambda c, h, p, f, n, t: f"coll {c} {h} {p} {f} {n} {t}", st.integers(0, 3),
              st.integers(0, 12), _IDS, st.sampled_from(["AllReduce", "Send", "Weird", "x"]),
              st.integers(0, 2**64 - 1), st.sampled_from(["ncclFloat32", "Unknown", "q"])),
    st.builds(lambda c, h, p, s, n, k, pid: f"op {c} {h} {p} {s} {n} {k} {pid}",
              st.integers(0, 3), st.integers(0, 12), _IDS, st.integers(-1, 2),
              st.integers(-5, 50), st.integers(-5, 1 << 30), st.sampled_from([0, 0, 1, 99999])),
    st.builds(lambda c, h, p, s: f"step {c} {h} {p} {s}", st.integers(0, 3),
              st.integers(0, 12), _IDS, st.integers(-3, 100)),
    st.builds(lambda c, h, t, p: f"event {c} {h} {t} {p}", st.integers(0, 3),
              st.integers(0, 12), st.integers(0, 1 << 20), _IDS),
    st.builds(lambda h, s, z: f"state {h} {s} {z}", _IDS, st.integers(-2, 40),
              st.sampled_from(["-", "0", "4096", str(2**63)])),
    st.builds(lambda h: f"stop {h}", _IDS),
    st.builds(lambda h, a: f"junk {h} {a:x}", st.integers(0, 12),
              st.sampled_from([0, 8, 0x1000, 0xDEADBEEF, 2**47 - 8, 2**64 - 1])),
    st.builds(lambda c: f"fin {c}", st.integers(0, 2)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(commands=st.lists(_COMMANDS, max_size=80), release=st.sampled_from(sorted(RELEASES)))
def test_malformed_and_out_of_order_events_never_crash_the_job(
        harness: Path, tmp_path_factory: pytest.TempPathFactory, commands: list[str],
        release: str) -> None:
    qdir = tmp_path_factory.mktemp("q")
    # every handle starts as junk the plugin never gave out, then the script's own
    script = "\n".join(["junk 12 1234", *commands, "init 3 2 0 1", *commands, ""])
    r = drive(harness, script, release, qdir)
    assert r.returncode == 0 and r.stdout.endswith("done\n"), (r.returncode, r.stderr)
    for path in qdir.glob("nccl-*"):
        rec = parse(path.read_bytes())  # whole, with its checksum
        for c in rec.comms:  # no burst the reader had to drop
            assert c.bursts.size == min(c.total, BURSTS)


def test_memory_stays_bounded_however_many_events(harness: Path, tmp_path: Path) -> None:
    """Fixed pools, never freed: a million events leave the peak where the first pass through
    the pools (16,384 collectives and proxy ops) left it."""
    def hwm(colls: int) -> int:
        lines = ["init 0 8 0 1"]
        for i in range(colls):
            c, o, s = 3 * i % 60000, (3 * i + 1) % 60000, (3 * i + 2) % 60000
            lines += [f"coll 0 {c} - AllReduce 10 ncclInt8", f"stop {c}",
                      f"op 0 {o} {c} 1 1 10 0", f"step 0 {s} {o} 0", f"state {s} 9 10",
                      f"stop {s}", f"stop {o}"]
            if i % 7 == 0:
                lines.append(f"op 0 {o} - 0 1 10 31337")  # PXN: another process's op
        lines += ["mem", ""]
        r = drive(harness, "\n".join(lines), "2.30", tmp_path)
        assert r.returncode == 0, r.stderr
        return int(r.stdout.split("hwm ")[1].split()[0])
    small, large = hwm(20_000), hwm(150_000)
    assert large < small + 512, (small, large)  # KB


def test_a_forked_child_keeps_its_own_record(harness: Path, tmp_path: Path) -> None:
    script = one_collective().replace("fin 0\n", "fork\nfin 0\n")
    r = drive(harness, script, "2.30", tmp_path)
    assert r.returncode == 0, r.stderr
    child = int(r.stdout.split("child ")[1].split()[0])
    parent = int(r.stdout.split("pid ")[1].split()[0])
    records = {rec.pid: rec for rec in (parse(p.read_bytes()) for p in tmp_path.glob("nccl-*"))}
    assert sorted(records) == sorted([parent, child])
    assert [c.comm_hash for c in records[parent].comms] == [77]
    assert [c.comm_hash for c in records[child].comms] == [6363]  # none of the parent's


def test_the_reader_prunes_the_files_of_processes_that_are_gone(harness: Path,
                                                               tmp_path: Path) -> None:
    assert drive(harness, one_collective(), "2.30", tmp_path).returncode == 0
    assert list(tmp_path.glob("nccl-*"))
    records, problems = read_dir(tmp_path, prune=True)
    assert records == [] and problems == [] and not list(tmp_path.glob("nccl-*"))
