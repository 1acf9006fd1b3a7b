"""Decisions on the wire, over real verbs: RC QPs on two soft-RoCE devices over a veth pair.

Needs the rig's RDMA setup (rxe0 on veth0 = 10.77.0.1, rxe1 on veth1 = 10.77.0.2, RoCEv2 GID
index 1), which tests/rig/rxe_vm.py builds in a VM on kernels without RDMA;
tests/test_rxe_vm.py boots it and runs this file inside. Every test captures the RoCEv2
packets on veth0 with tcpdump (both directions cross it) and checks each packet's UDP source
port and DSCP against the decision table.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.cbuild import build
from transport import native
from transport.decision_table import Decision, TableWriter
from transport.qp_records import job_bytes_posted, parse
from transport.steering import steering_for
from transport.verbs import flow_label_for

pytestmark = pytest.mark.rdma

A, B = "10.77.0.1", "10.77.0.2"  # rxe0 / rxe1
OWN_TC = 40  # the program's own traffic class: DSCP 10
SYS = Path("/sys/class/infiniband")


def _rig_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (packet capture)"
    if not ((SYS / "rxe0").exists() and (SYS / "rxe1").exists()
            and Path("/sys/class/net/veth0").exists()):
        return ("needs the soft-RoCE rig (rxe0 on veth0, rxe1 on veth1; tests/rig/rxe_vm.py "
                "builds it, tests/test_rxe_vm.py runs this file there)")
    if shutil.which("tcpdump") is None:
        return "tcpdump not found"
    return None


@pytest.fixture(scope="module")
def rig() -> None:
    reason = _rig_missing()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def progs(rig: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("cbin")
    return {"nccl": build(out, "rc_pair_nccl", ["tests/c/rc_pair.c"]),
            **{f"nccl{g}": build(out, f"rc_pair_nccl{g}", ["tests/c/rc_pair.c"],
                                 f"-DNCCL_LOADER={g}", "-ldl") for g in (229, 230)},
            "direct": build(out, "rc_pair_direct", ["tests/c/rc_pair.c"], "-DDIRECT_LINK",
                            "-libverbs"),
            "lib": native.library(native.IBVERBS)}


@contextmanager
def capture(tmp: Path) -> Iterator[dict[str, set[tuple[int, int]]]]:
    """{source address: {(UDP source port, DSCP)}} of the RoCEv2 packets seen on veth0."""
    from scapy.layers.inet import IP, UDP
    from scapy.utils import rdpcap

    pcap = tmp / f"cap-{time.monotonic_ns()}.pcap"
    # --immediate-mode: without it packets wait in a TPACKET_V3 block until the block times
    # out, and those still waiting when tcpdump is interrupted are never written.
    p = subprocess.Popen(["tcpdump", "-i", "veth0", "-n", "--immediate-mode", "-U", "-w",
                          str(pcap), "udp dst port 4791"], stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    line = p.stderr.readline()  # "listening on veth0 ..." once the capture is armed
    assert "listening" in line, line
    seen: dict[str, set[tuple[int, int]]] = {}
    try:
        yield seen
    finally:
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=30)
    for pkt in rdpcap(str(pcap)):
        if IP in pkt and UDP in pkt:
            seen.setdefault(pkt[IP].src, set()).add((pkt[UDP].sport, pkt[IP].tos >> 2))


def write_table(path: Path, *decisions: Decision) -> None:
    with TableWriter.open(path, capacity=64) as w:
        w.apply(list(decisions), 1)


def run_pairs(prog: Path, env: dict[str, str], *args: str) -> list[dict[str, object]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRUX_")}
    r = subprocess.run([str(prog), "--tc", str(OWN_TC), *args], env={**base, **env},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


@pytest.mark.parametrize(("a_to_b", "b_to_a"), [((0xC000, 26), (0xFFFF, 46)),
                                                ((51234, 10), (60001, 34))])
def test_pyverbs_qps_carry_the_decided_port_and_dscp(rig: None, tmp_path: Path,
                                                     a_to_b: tuple[int, int],
                                                     b_to_a: tuple[int, int]) -> None:
    from transport.verbs import RcQp

    table = tmp_path / "decisions"
    write_table(table, Decision("pv", B, 2, a_to_b[1], a_to_b[1] << 2, a_to_b[0], 1),
                Decision("pv", A, 1, b_to_a[1], b_to_a[1] << 2, b_to_a[0], 1))
    with RcQp("rxe0") as qa, RcQp("rxe1") as qb, capture(tmp_path) as seen:
        ea, eb = qa.endpoint(), qb.endpoint()
        assert (ea.gid, eb.gid) == (A, B)
        qa.connect(eb, steering_for(str(table), "pv", eb.gid))
        qb.connect(ea, steering_for(str(table), "pv", ea.gid))
        qa.write(eb, 4)
        qb.write(ea, 4)
        av = qa.address_vector()
        assert (av.flow_label, av.traffic_class) == (flow_label_for(a_to_b[0]), a_to_b[1] << 2)
    assert seen == {A: {a_to_b}, B: {b_to_a}}


def test_shim_loaded_the_nccl_way(progs: dict[str, Path], tmp_path: Path) -> None:
    table, qps = tmp_path / "decisions", tmp_path / "qps"
    qps.mkdir()
    write_table(table, Decision("nccl", B, 3, 26, 104, 51234, 1),
                Decision("nccl", A, 2, 46, 184, 60001, 1))
    env = {"NCCL_IBVERBS_LIB": str(progs["lib"]), "CRUX_JOB_ID": "nccl",
           "CRUX_DECISION_TABLE": str(table), "CRUX_QP_DIR": str(qps)}
    with capture(tmp_path) as seen:
        pairs = run_pairs(progs["nccl"], env, "--pairs", "2", "--keep", "1")
    assert seen == {A: {(51234, 26)}, B: {(60001, 46)}}
    for p in pairs:
        assert p["a"] == {"qpn": p["a"]["qpn"], "flow_label": 51234 & 0x3FFF,  # type: ignore
                          "traffic_class": 104}
        assert p["b"]["traffic_class"] == 184  # type: ignore[index]
    (f,) = list(qps.iterdir())
    rec = parse(f.read_bytes())
    assert rec.job_id == "nccl" and rec.counters["applied"] == 4 and rec.calls == 4
    got = sorted((q.device, q.peer, q.sport, q.dscp, q.level, q.orig_traffic_class)
                 for q in rec.qps)
    assert got == sorted([("rxe0", B, 51234, 26, 3, OWN_TC)] * 2
                         + [("rxe1", A, 60001, 46, 2, OWN_TC)] * 2)


@pytest.mark.parametrize("gen", [229, 230])
def test_both_nccl_generations_under_crux_run_env(progs: dict[str, Path], tmp_path: Path,
                                                  gen: int) -> None:
    """NCCL <= 2.29 (libibverbs.so by name) and >= 2.30 ($NCCL_IBVERBS_LIB first), each with
    exactly the environment `crux-run --print-env` gives a job: every RoCEv2 packet carries the
    decided port and DSCP."""
    table, qps = tmp_path / "decisions", tmp_path / "qps"
    qps.mkdir()
    write_table(table, Decision("gen", B, 3, 26, 104, 0xD00D, 1),
                Decision("gen", A, 2, 46, 184, 0xE00E, 1))
    crux_run = Path(sys.executable).parent / "crux-run"
    out = subprocess.run([str(crux_run), "--print-env", "--job-id", "gen", "--table",
                          str(table), "--no-sock"], capture_output=True, text=True, check=True)
    env = {k: shlex.split(v)[0] for k, _, v in (ln.removeprefix("export ").partition("=")
                                                for ln in out.stdout.splitlines())}
    assert set(env) == {"CRUX_JOB_ID", "CRUX_DECISION_TABLE", "LD_LIBRARY_PATH",
                        "NCCL_IBVERBS_LIB", "NCCL_PROFILER_PLUGIN"}  # the plugin: unused here
    with capture(tmp_path) as seen:
        run_pairs(progs[f"nccl{gen}"], {**env, "CRUX_QP_DIR": str(qps)}, "--pairs", "2")
    assert seen == {A: {(0xD00D, 26)}, B: {(0xE00E, 46)}}
    (f,) = list(qps.iterdir())
    assert parse(f.read_bytes()).counters["applied"] == 4


def test_wrapper_counts_each_qps_bytes(progs: dict[str, Path], tmp_path: Path) -> None:
    """Real RDMA WRITEs through the wrapper: every QP's record counts the bytes and WRs it
    posted and a busy time, live QPs in their records and destroyed ones in the header, so the
    job's total is the same either way; with CRUX_QP_COUNTERS=off nothing is counted."""
    table = tmp_path / "decisions"
    write_table(table)  # no decisions: counting does not depend on them
    base = {"NCCL_IBVERBS_LIB": str(progs["lib"]), "CRUX_JOB_ID": "bytes",
            "CRUX_DECISION_TABLE": str(table)}
    posted = 2 * 2 * 5 * 3000  # 2 pairs, both directions, 5 writes of 3000 bytes each
    for keep, counting in (("1", "on"), ("0", "on"), ("1", "off")):
        qps = tmp_path / f"qps-{keep}-{counting}"
        qps.mkdir()
        env = {**base, "CRUX_QP_DIR": str(qps), "CRUX_QP_COUNTERS": counting}
        run_pairs(progs["nccl"], env, "--pairs", "2", "--writes", "5", "--size", "3000",
                  "--keep", keep)
        (f,) = list(qps.iterdir())
        rec = parse(f.read_bytes())
        total = job_bytes_posted([rec], "bytes")
        if counting == "off":
            assert total == 0 and all(q.wrs_posted == 0 for q in rec.qps)
        elif keep == "1":
            assert len(rec.qps) == 4 and rec.retired.bytes_posted == 0
            assert [(q.bytes_posted, q.wrs_posted) for q in rec.qps] == [(15000, 5)] * 4
            assert all(q.busy_ns > 0 for q in rec.qps) and total == posted
        else:
            assert rec.qps == () and (rec.retired.bytes_posted, rec.retired.wrs_posted) == (
                posted, 20)
            assert rec.retired.busy_ns > 0 and total == posted


def test_shim_through_ld_preload(progs: dict[str, Path], tmp_path: Path) -> None:
    table = tmp_path / "decisions"
    write_table(table, Decision("pre", None, 1, 34, 136, 0xE000, 1))  # job-wide
    env = {"LD_PRELOAD": str(progs["lib"]), "CRUX_JOB_ID": "pre",
           "CRUX_DECISION_TABLE": str(table), "CRUX_QP_DIR": str(tmp_path)}
    with capture(tmp_path) as seen:
        run_pairs(progs["direct"], env)
    assert seen == {A: {(0xE000, 34)}, B: {(0xE000, 34)}}


def _fail_open_cases(tmp: Path) -> dict[str, tuple[dict[str, str], str]]:
    good = tmp / "good"
    write_table(good, Decision("fo", None, 1, 26, 104, 51234, 1))
    raw = good.read_bytes()
    future = bytearray(raw)
    future[8] = 9
    files = {"truncated": raw[:100], "garbage": os.urandom(len(raw)), "future": bytes(future)}
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    cases = {name: ({"CRUX_JOB_ID": "fo", "CRUX_DECISION_TABLE": str(tmp / name)},
                    "bad-table") for name in files}
    cases["missing"] = ({"CRUX_JOB_ID": "fo", "CRUX_DECISION_TABLE": str(tmp / "none")},
                        "no-table")
    cases["other-job"] = ({"CRUX_JOB_ID": "x", "CRUX_DECISION_TABLE": str(good)}, "no-entry")
    cases["no-job"] = ({"CRUX_DECISION_TABLE": str(good)}, "no-job")
    return cases


def test_shim_fails_open(progs: dict[str, Path], tmp_path: Path) -> None:
    for name, (env, reason) in _fail_open_cases(tmp_path).items():
        qps = tmp_path / f"qps-{name}"
        qps.mkdir()
        env = {**env, "NCCL_IBVERBS_LIB": str(progs["lib"]), "CRUX_QP_DIR": str(qps)}
        with capture(tmp_path) as seen:
            pairs = run_pairs(progs["nccl"], env)
        # the program's own class, the NIC's own port (flow label 0: derived from the QPNs)
        assert {d for s in seen.values() for _, d in s} == {OWN_TC >> 2}, name
        assert all(sp != 51234 for s in seen.values() for sp, _ in s), name
        assert pairs[0]["a"]["flow_label"] == 0, name  # type: ignore[index]
        (f,) = list(qps.iterdir())
        assert parse(f.read_bytes()).counters[reason] == 2, name


WRITER = """
import sys, time
from transport.decision_table import Decision, TableWriter
with TableWriter.open(sys.argv[1], capacity=64) as w:
    print("ready", flush=True)
    n = 0
    while True:  # rewrite the job's entry as fast as possible until killed mid-write
        n += 1
        w.apply([Decision("kill", None, 1, 26, 104, 0xD000 + n % 2, n)], n)
"""


def test_writer_killed_mid_run(progs: dict[str, Path], tmp_path: Path) -> None:
    table = tmp_path / "decisions"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(table)],
                              stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parent.parent)
    assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
    env = {"NCCL_IBVERBS_LIB": str(progs["lib"]), "CRUX_JOB_ID": "kill",
           "CRUX_DECISION_TABLE": str(table), "CRUX_QP_DIR": str(tmp_path)}
    job = subprocess.Popen([str(progs["nccl"]), "--tc", str(OWN_TC), "--pairs", "6",
                            "--gap-ms", "300"], env={**os.environ, **env},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.8)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    out, err = job.communicate(timeout=120)
    assert job.returncode == 0, err
    pairs = [json.loads(line) for line in out.splitlines()]
    assert len(pairs) == 6 and all(p["ok"] for p in pairs)
    for p in pairs:  # a decision from the table, or the program's own settings
        assert (p["a"]["flow_label"], p["a"]["traffic_class"]) in {
            (0xD000 & 0x3FFF, 104), (0xD001 & 0x3FFF, 104), (0, OWN_TC)}


def test_rxe_ports_as_the_agent_sees_them(rig: None) -> None:
    """What the agent's link reports read on a real (soft-)RoCE port: rxe states its rate,
    has no ECN/CNP hw_counters and no IB PortCounters (counters/port_xmit_data), so its
    RoCE bytes are counted on the netdev under it."""
    from cruxd.measure.sampling.links import congestion_counters, port_speed_bps
    from cruxd.measure.sampling.nic import rdma_counters

    root = Path("/sys")
    assert port_speed_bps(root, "rdma:rxe0/1") == 10e9  # "10 Gb/sec (1X FDR10)"
    assert port_speed_bps(root, "net:veth0") == 10e9
    assert congestion_counters(root, "rdma:rxe0/1") == []
    assert [c for c in rdma_counters(root) if c.name.startswith("rdma:rxe")] == []


def test_doctor_on_the_soft_roce_ports(rig: None) -> None:
    """`cruxctl doctor` on real (soft-)RoCE ports: ok while they are up with their RoCE v2
    GIDs, a failure naming them while both links are down (put back up after)."""
    import json
    import time

    def doctor() -> dict[str, dict[str, str]]:
        run = subprocess.run([sys.executable, "-m", "cruxd.cli.cruxctl", "doctor", "--json",
                              "--socket", "/nonexistent/agent.sock"], capture_output=True,
                             text=True, timeout=60)
        return {x["name"]: x for x in json.loads(run.stdout)["checks"]}

    def states() -> set[str]:
        return {(SYS / f"rxe{i}" / "ports" / "1" / "state").read_text().split(":")[-1].strip()
                for i in (0, 1)}

    ok = doctor()["rdma"]
    assert ok["status"] == "ok" and "rxe0/1 ACTIVE, RoCE v2 GID" in ok["detail"], ok
    try:
        for dev in ("veth0", "veth1"):
            subprocess.run(["ip", "link", "set", dev, "down"], check=True)
        deadline = time.monotonic() + 10
        while "ACTIVE" in states() and time.monotonic() < deadline:
            time.sleep(0.1)
        bad = doctor()["rdma"]
        assert bad["status"] == "fail" and "rxe0/1" in bad["detail"], bad
    finally:
        for dev in ("veth0", "veth1"):
            subprocess.run(["ip", "link", "set", dev, "up"], check=True)
        # a link going down takes its routes with it: the rig's (tests/rig/rxe_vm/stage2.sh)
        # back, for the tests that follow
        for dst, dev, src, table in (("10.77.0.2", "veth0", "10.77.0.1", "100"),
                                     ("10.77.0.1", "veth1", "10.77.0.2", "101")):
            subprocess.run(["ip", "route", "replace", dst, "dev", dev, "src", src, "table",
                            table], check=True)
        deadline = time.monotonic() + 20
        while states() != {"ACTIVE"} and time.monotonic() < deadline:
            time.sleep(0.1)
    assert states() == {"ACTIVE"}


def test_a_record_name_planted_by_another_user_costs_the_job_nothing(
        progs: dict[str, Path], tmp_path: Path) -> None:
    """Issue 37, item 3, on real verbs: `nobody` creates the job's record name (a file of its
    own, 0666) in the shared records directory before the job's first QP. The wrapper leaves
    it alone and records under the next name (`<pid>.1`), and the job runs as it would."""
    from tests.nobody import as_nobody

    table = tmp_path / "decisions"
    write_table(table, Decision("planted", None, 1, 34, 136, 0xE000, 1))  # job-wide
    qps = Path(tempfile.mkdtemp(prefix="crux-qps-"))  # like /run/crux/qps: sticky, open to all
    os.chmod(qps, 0o1777)
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRUX_")}
    env = {**base, "NCCL_IBVERBS_LIB": str(progs["lib"]), "CRUX_JOB_ID": "planted",
           "CRUX_DECISION_TABLE": str(table), "CRUX_QP_DIR": str(qps)}
    # stopped before it runs, so the name to plant (its pid) is known first
    job = subprocess.Popen(["sh", "-c", 'kill -STOP $$; exec "$0" "$@"', str(progs["nccl"]),
                            "--tc", str(OWN_TC), "--pairs", "2"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 10
        while Path(f"/proc/{job.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < end, "the job did not stop"
            time.sleep(0.01)
        planted = qps / str(job.pid)

        def plant() -> str:
            fd = os.open(planted, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            os.fchmod(fd, 0o666)
            os.write(fd, b"planted by nobody")
            os.close(fd)
            return "ok"

        assert as_nobody(plant) == "ok"
        job.send_signal(signal.SIGCONT)
        _, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    try:
        assert job.returncode == 0, err  # the job never dies because of crux
        assert planted.read_bytes() == b"planted by nobody" and planted.stat().st_uid == 65534
        mine = qps / f"{job.pid}.1"
        assert mine.stat().st_uid == os.getuid(), sorted(p.name for p in qps.iterdir())
        rec = parse(mine.read_bytes())
        assert rec.job_id == "planted" and rec.counters["applied"] >= 1, rec.counters
    finally:
        shutil.rmtree(qps, ignore_errors=True)

