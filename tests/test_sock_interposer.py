"""libcrux_sock.so, the TCP interposer, in real processes over loopback: a Python client runs
under LD_PRELOAD and connects to listeners in the test; the bound source port, the TOS and
the per-process counters (sock-<pid>) are checked against the decision table."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from cruxd.agent.dataplane import DataPlane, JobOwners
from cruxd.cli.status_view import print_status
from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
from cruxd.testing import Daemon, crux_run, cruxctl, status, wait_for
from transport import native
from transport.decision_table import (
    Decision,
    TableHeader,
    TableReader,
    TableWriter,
    pack_header,
)
from transport.sock_records import _REC, MAGIC, OUTCOMES, SockCounts, read_file
from transport.sock_records import read_dir as read_sock_dir

JOB, TC = "job-tcp", 184  # DSCP 46

# The job: one line of JSON per command on stdin, one line of JSON per answer. Sockets stay
# open (and the process alive) until stdin closes, so the 4-tuples stay taken.
CLIENT = r"""
import json, os, socket, sys, threading
print(json.dumps({"pid": os.getpid()}), flush=True)
keep, listeners = [], []

def tos(s):
    if s.family == socket.AF_INET6:
        return s.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS)
    return s.getsockopt(socket.IPPROTO_IP, socket.IP_TOS)

def connect(host, port, kind="tcp", bind=None, nonblock=False, **_):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)
    keep.append(s)
    if bind is not None:
        s.bind(tuple(bind))
    out = {"err": 0}
    if nonblock:
        s.setblocking(False)
        out["err"] = s.connect_ex((host, port))  # EINPROGRESS, or 0 at once on loopback
        import select
        select.select([], [s], [], 10)
        out["again"] = s.connect_ex((host, port))  # EISCONN or 0: the kernel's answer
    else:
        s.connect((host, port))
    out.update(sport=s.getsockname()[1], tos=tos(s))
    if fam == socket.AF_INET6:
        out["ip_tos"] = s.getsockopt(socket.IPPROTO_IP, socket.IP_TOS)
    return out

for line in sys.stdin:
    cmd = json.loads(line)
    op = cmd.pop("op")
    if op == "connect":
        res = connect(**cmd)
    elif op == "listen":
        srv = socket.create_server((cmd["host"], 0), backlog=8)
        listeners.append(srv)
        res = {"port": srv.getsockname()[1]}
    elif op == "accept":  # on the last listener; "libc": through libc's accept(), not accept4
        if cmd.get("libc"):
            import ctypes
            fd = ctypes.CDLL(None, use_errno=True).accept(listeners[-1].fileno(), None, None)
            conn = socket.socket(fileno=fd)
        else:
            conn = listeners[-1].accept()[0]
        keep.append(conn)
        res = {"tos": tos(conn), "peer_port": conn.getpeername()[1]}
    elif op == "threads":
        res = [None] * cmd["n"]
        def one(i):
            res[i] = connect(cmd["host"], cmd["port"])
        ts = [threading.Thread(target=one, args=(i,)) for i in range(cmd["n"])]
        for t in ts: t.start()
        for t in ts: t.join()
    elif op == "fork":
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, json.dumps(connect(**cmd)).encode())
            os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        res = {"child": pid, **json.loads(os.read(r, 4096))}
    print(json.dumps(res), flush=True)
"""


class Client:
    def __init__(self, tmp: Path, table: Path | None, job: str | None = JOB,
                 qps: Path | None = None, **env: str) -> None:
        """qps: $CRUX_QP_DIR, default tmp/qps; pass the table's directory + /qps to leave
        the variable unset (the interposer's default)."""
        table = table or tmp / "nothing-here"
        self.qps = qps or tmp / "qps"
        base = {k: v for k, v in os.environ.items()
                if not k.startswith("CRUX_") and k != "LD_PRELOAD"}
        base.update(LD_PRELOAD=str(native.library(native.SOCK)),
                    CRUX_DECISION_TABLE=str(table), **env)
        if self.qps != table.parent / "qps":
            base["CRUX_QP_DIR"] = str(self.qps)
        if job is not None:
            base["CRUX_JOB_ID"] = job
        self.qps.mkdir(exist_ok=True)
        self.err = tmp / f"client-{time.monotonic_ns()}.err"
        with open(self.err, "w") as err:
            self.p = subprocess.Popen([sys.executable, "-c", CLIENT], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=err, text=True, env=base)
        self.pid = self.answer()["pid"]

    def answer(self) -> Any:
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        assert line, f"client died: {self.err.read_text()}"
        return json.loads(line)

    def __call__(self, op: str = "connect", **cmd: Any) -> Any:
        assert self.p.stdin is not None
        self.p.stdin.write(json.dumps({"op": op, **cmd}) + "\n")
        self.p.stdin.flush()
        return self.answer()

    def counts(self, pid: int | None = None) -> SockCounts:
        return read_file(self.qps / f"sock-{pid or self.pid}")

    def close(self) -> str:
        if self.p.stdin is not None:
            self.p.stdin.close()
        self.p.wait(timeout=30)
        return self.err.read_text()


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[list[Client]]:
    made: list[Client] = []
    yield made
    for c in made:
        c.p.kill()
        c.p.wait()


def free_ports(n: int, family: int = socket.AF_INET) -> list[int]:
    """n distinct ports free right now (held together, so the OS cannot hand one out twice)."""
    held = [socket.socket(family, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in held:
            s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def listener(host: str = "127.0.0.1") -> socket.socket:
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, 0), family=fam, backlog=64)


def table(path: Path, *ds: Decision) -> Path:
    with TableWriter.open(path, capacity=16) as w:
        w.apply(list(ds), plan_generation=1)
    return path


def steered(peer: str | None, dport: int, sports: list[int], tc: int = TC) -> Decision:
    return Decision(JOB, peer, 3, tc >> 2, tc, 0, 1, tcp_dport=dport, tcp_sports=tuple(sports))


def only(counts: SockCounts, **want: int) -> None:
    """The counters are exactly `want` (outcome names with _ for -), every other one zero."""
    expect = {k: want.get(k.replace("-", "_"), 0) for k in OUTCOMES}
    assert counts.counters == expect and counts.calls == sum(expect.values())


def test_probed_ports_in_turn_then_the_kernels(tmp_path: Path, clients: list[Client]) -> None:
    srv, ports = listener(), free_ports(3)
    dport = srv.getsockname()[1]
    t = table(tmp_path / "decisions", steered("127.0.0.1", dport, ports))
    c = Client(tmp_path, t, CRUX_SHIM_LOG="1")
    clients.append(c)
    got = [c(host="127.0.0.1", port=dport) for _ in range(4)]
    assert [g["sport"] for g in got[:3]] == ports  # successive ports of the set
    assert got[3]["sport"] not in ports  # every port taken: the kernel's (fail open)
    assert {g["tos"] for g in got} == {TC}
    assert {srv.accept()[1][1] for _ in range(4)} == {g["sport"] for g in got}  # server agrees
    counts = c.counts()
    only(counts, applied=3, ports_busy=1)
    assert (counts.pid, counts.job_id) == (c.pid, JOB)
    assert (c.qps / f"sock-{c.pid}").stat().st_mode & 0o777 == 0o444  # locked: crux_recfile.h
    log = [ln for ln in c.close().splitlines() if ln.startswith("crux-sock:")]
    assert len(log) == 5 and f"applied, sport {ports[0]}, tos {TC}" in log[0], log
    assert "ports busy: every decided source port" in log[3]  # said before the connect
    assert "ports-busy, sport 0" in log[4]


def test_busy_ports_are_said_once_per_route_without_the_log_switch(
        tmp_path: Path, clients: list[Client]) -> None:
    """Without CRUX_SHIM_LOG: one stderr line per route (peer, destination port) the first
    time its decided ports are all held, naming them; the later fallbacks are counted only."""
    a, b = listener(), listener()
    ports = free_ports(2)
    da, db = a.getsockname()[1], b.getsockname()[1]
    t = table(tmp_path / "decisions", steered("127.0.0.1", da, ports))
    c = Client(tmp_path, t)
    clients.append(c)
    got = [c(host="127.0.0.1", port=da)["sport"] for _ in range(5)]
    assert sorted(got[:2]) == sorted(ports) and not set(got[2:]) & set(ports)
    # another destination port of the same peer is not probed: the class only, nothing said
    c(host="127.0.0.1", port=db)
    only(c.counts(), applied=2, ports_busy=3, tos_only=1)
    log = [ln for ln in c.close().splitlines() if ln.startswith("crux-sock:")]
    listed = ",".join(str(p) for p in ports)
    assert log == [f"crux-sock: pid {c.pid} job '{JOB}' -> 127.0.0.1 port {da}: ports busy: "
                   f"every decided source port ({listed}) is in use, the kernel picks the port "
                   f"(ECMP's path, tos {TC}); said once per route, counted as ports-busy"], log


def test_the_routes_said_are_bounded(tmp_path: Path, clients: list[Client]) -> None:
    """A job whose ports are busy toward many routes: 64 lines, then one saying that further
    routes are counted, not said; every fallback counted."""
    held = listener()  # the set's one port, held by a listener: every bind of it fails
    port = held.getsockname()[1]
    srv = socket.create_server(("0.0.0.0", 0), backlog=128)  # every 127.0.0.x
    dport = srv.getsockname()[1]
    peers = [f"127.0.0.{i + 2}" for i in range(70)]  # 70 routes: one per peer
    t = tmp_path / "decisions"
    with TableWriter.open(t, capacity=128) as w:
        w.apply([Decision(JOB, p, 3, TC >> 2, TC, 0, 1, tcp_dport=dport, tcp_sports=(port,))
                 for p in peers], plan_generation=1)
    c = Client(tmp_path, t)
    clients.append(c)
    for p in peers:
        c(host=p, port=dport)
    only(c.counts(), ports_busy=70)
    log = [ln for ln in c.close().splitlines() if ln.startswith("crux-sock:")]
    assert len(log) == 65 and all("ports busy" in ln for ln in log[:64]), log
    assert log[64] == (f"crux-sock: pid {c.pid} job '{JOB}': 64 routes fell back to kernel "
                       "ports; further ones are counted (ports-busy), not logged")


@pytest.mark.parametrize("libc", [False, True], ids=["accept4", "accept"])
def test_an_accepted_connection_takes_its_peers_class(tmp_path: Path, clients: list[Client],
                                                       libc: bool) -> None:
    """Its ACKs then ride the job's level: at DSCP 0 a top-level job's ACKs queued behind
    its own data on the reverse link (docs/shim.md, "Accepted connections")."""
    t = table(tmp_path / "t", steered("127.0.0.1", 1, []))  # 127.0.0.2: no entry, no default
    c = Client(tmp_path, t, CRUX_SHIM_LOG="1")
    clients.append(c)
    port = c("listen", host="0.0.0.0")["port"]
    with socket.create_connection(("127.0.0.1", port)) as mine:
        got = c("accept", libc=libc)
        assert got["peer_port"] == mine.getsockname()[1] and got["tos"] == TC
    with socket.socket() as other:
        other.bind(("127.0.0.2", 0))
        other.connect(("127.0.0.1", port))
        assert c("accept", libc=libc)["tos"] == 0  # nothing decided for that peer
    counts = c.counts()
    assert counts.accepts == 1 and counts.calls == 0  # accepts are not connects
    log = [ln for ln in c.close().splitlines() if ln.startswith("crux-sock:")]
    assert len(log) == 1 and f"accepted, tos {TC}" in log[0], log


def test_a_port_in_use_is_skipped(tmp_path: Path, clients: list[Client]) -> None:
    srv, ports = listener(), free_ports(3)
    dport = srv.getsockname()[1]
    holder = socket.socket()
    holder.bind(("127.0.0.1", ports[0]))  # someone else's socket on the first port
    c = Client(tmp_path, table(tmp_path / "t", steered("127.0.0.1", dport, ports)))
    clients.append(c)
    assert c(host="127.0.0.1", port=dport)["sport"] == ports[1]
    only(c.counts(), applied=1)
    holder.close()


def test_class_only_for_an_unprobed_port_or_a_bound_socket(tmp_path: Path,
                                                            clients: list[Client]) -> None:
    srv, other, ports = listener(), listener(), free_ports(2)
    dport, oport = srv.getsockname()[1], other.getsockname()[1]
    c = Client(tmp_path, table(tmp_path / "t", steered("127.0.0.1", dport, ports)))
    clients.append(c)
    got = c(host="127.0.0.1", port=oport)  # the ports were probed toward dport, not here
    assert got["sport"] not in ports and got["tos"] == TC
    mine = free_ports(1)[0]
    got = c(host="127.0.0.1", port=dport, bind=["127.0.0.1", mine])  # the program's own port
    assert (got["sport"], got["tos"]) == (mine, TC)
    only(c.counts(), tos_only=2)


def test_job_wide_entry_ipv6_and_ipv4_mapped(tmp_path: Path, clients: list[Client]) -> None:
    srv4, srv6 = listener(), listener("::1")
    d4, d6 = srv4.getsockname()[1], srv6.getsockname()[1]
    p4, p6 = free_ports(2), free_ports(2, socket.AF_INET6)
    t = table(tmp_path / "t", steered("127.0.0.1", d4, p4), steered("::1", d6, p6, tc=104),
              Decision(JOB, None, 1, 10, 40, 0, 1))
    c = Client(tmp_path, t)
    clients.append(c)
    got = c(host="::1", port=d6)
    assert (got["sport"], got["tos"]) == (p6[0], 104)  # IPV6_TCLASS
    got = c(host="::ffff:127.0.0.1", port=d4)  # AF_INET6 socket to an IPv4-mapped peer
    assert got["sport"] in p4 and (got["tos"], got["ip_tos"]) == (TC, TC)
    srv2 = listener("127.0.0.2")  # no per-peer entry: the job-wide one, class only
    got = c(host="127.0.0.2", port=srv2.getsockname()[1])
    assert got["sport"] not in p4 and got["tos"] == 40
    only(c.counts(), applied=2, tos_only=1)


def test_nonblocking_connect_is_steered_and_counted_once(tmp_path: Path,
                                                         clients: list[Client]) -> None:
    srv, ports = listener(), free_ports(2)
    dport = srv.getsockname()[1]
    c = Client(tmp_path, table(tmp_path / "t", steered("127.0.0.1", dport, ports)))
    clients.append(c)
    got = c(host="127.0.0.1", port=dport, nonblock=True)
    assert got["err"] in (0, errno.EINPROGRESS) and got["again"] in (0, errno.EISCONN)
    assert (got["sport"], got["tos"]) == (ports[0], TC)
    only(c.counts(), applied=1)  # the second connect (completion poll) is the kernel's


def test_threads_share_the_set(tmp_path: Path, clients: list[Client]) -> None:
    srv, ports = listener(), free_ports(8)
    dport = srv.getsockname()[1]
    c = Client(tmp_path, table(tmp_path / "t", steered("127.0.0.1", dport, ports)))
    clients.append(c)
    got = c("threads", n=8, host="127.0.0.1", port=dport)
    assert sorted(g["sport"] for g in got) == sorted(ports)  # 8 sockets, 8 ports, no clash
    only(c.counts(), applied=8)


def test_a_forked_child_counts_in_its_own_file(tmp_path: Path, clients: list[Client]) -> None:
    srv, ports = listener(), free_ports(2)
    dport = srv.getsockname()[1]
    c = Client(tmp_path, table(tmp_path / "t", steered("127.0.0.1", dport, ports)))
    clients.append(c)
    assert c(host="127.0.0.1", port=dport)["sport"] == ports[0]
    child = c("fork", host="127.0.0.1", port=dport)
    assert child["sport"] == ports[1] and child["tos"] == TC
    only(c.counts(), applied=1)
    only(c.counts(child["child"]), applied=1)
    assert c.counts(child["child"]).pid == child["child"]


def _bad_tables(tmp: Path) -> dict[str, Path | None]:
    good = tmp / "good"
    table(good, Decision(JOB, None, 1, 10, 40, 0, 1))
    cases: dict[str, bytes | None] = {
        "missing": None, "empty": b"", "short": b"CRUXTBL1",
        "garbage": bytes(range(256)) * 16, "truncated": good.read_bytes()[:64 + 128 * 3],
        "future": pack_header(TableHeader(16, version=2)) + bytes(128 * 16)}
    out: dict[str, Path | None] = {}
    for name, raw in cases.items():
        out[name] = tmp / name
        if raw is not None:
            (tmp / name).write_bytes(raw)
    (tmp / "directory").mkdir()
    out["directory"] = tmp / "directory"
    return out


@pytest.mark.parametrize("case", ["missing", "empty", "short", "garbage", "truncated",
                                  "future", "directory", "no-entry", "no-job", "long-job",
                                  "off"])
def test_fail_open(tmp_path: Path, clients: list[Client], case: str) -> None:
    srv, ports = listener(), free_ports(2)
    dport = srv.getsockname()[1]
    good = table(tmp_path / "decisions", steered("127.0.0.1", dport, ports))
    kw: dict[str, Any] = {"table": good}
    if case in ("missing", "empty", "short", "garbage", "truncated", "future", "directory"):
        kw["table"] = _bad_tables(tmp_path)[case]
    elif case == "no-entry":
        kw["job"] = "another-job"
    elif case == "no-job":
        kw["job"] = None
    elif case == "long-job":  # no id of 64 bytes can be in the table
        kw["job"] = "x" * 64
    elif case == "off":
        kw["CRUX_SOCK"] = "0"
    c = Client(tmp_path, **kw)
    clients.append(c)
    got = c(host="127.0.0.1", port=dport)
    assert got["sport"] not in ports and got["tos"] == 0  # exactly as without crux
    conn = srv.accept()[0]  # the connection works both ways
    conn.sendall(b"x")
    conn.close()
    want = {"missing": "no_table", "no-entry": "no_entry", "no-job": "no_job",
            "long-job": "no_job"}.get(
        case, "bad_table")
    if case == "off":
        assert not (c.qps / f"sock-{c.pid}").exists()  # nothing counted, nothing written
    else:
        only(c.counts(), **{want: 1})


def test_not_tcp_is_passed_through_uncounted(tmp_path: Path, clients: list[Client]) -> None:
    srv, ports = listener(), free_ports(2)
    dport = srv.getsockname()[1]
    c = Client(tmp_path, table(tmp_path / "t", steered("127.0.0.1", dport, ports)))
    clients.append(c)
    got = c(host="127.0.0.1", port=dport, kind="udp")
    assert got["sport"] not in ports and got["tos"] == 0
    assert not (c.qps / f"sock-{c.pid}").exists()


def test_table_outlives_its_writer_and_replacements_apply_at_once(
        tmp_path: Path, clients: list[Client]) -> None:
    srv, ports = listener(), free_ports(4)
    dport = srv.getsockname()[1]
    path = tmp_path / "decisions"
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from transport.decision_table import Decision, TableWriter\n"
        "w = TableWriter.open(sys.argv[1], capacity=16)\n"
        f"w.apply([Decision({JOB!r}, '127.0.0.1', 3, 46, {TC}, 0, 1, {dport}, {ports[:2]})], 1)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"), str(path)], stdout=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parent.parent)
    assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
    writer.send_signal(signal.SIGKILL)  # the agent dies; its table stays
    writer.wait()
    c = Client(tmp_path, path)
    clients.append(c)
    assert c(host="127.0.0.1", port=dport)["sport"] == ports[0]
    # a restarted agent adopts the file and changes the decision: the generation moves, so
    # the interposer's per-peer cache must not answer with the old one
    with TableWriter.open(path, capacity=16) as w:
        w.apply([steered("127.0.0.1", dport, ports[:2], tc=104)], 2)
    got = c(host="127.0.0.1", port=dport)
    assert got["sport"] == ports[1] and got["tos"] == 104
    # an agent that replaces the file (another capacity) retires the old one: the next
    # connect reads the new decision, without waiting for a re-check
    with TableWriter.open(path, capacity=32) as w:
        w.apply([steered("127.0.0.1", dport, ports[2:], tc=40)], 3)
        got = c(host="127.0.0.1", port=dport)
        assert got["sport"] in ports[2:] and got["tos"] == 40
        # a writer killed in the middle of an entry leaves it odd, and the generation where
        # it was: a process that looked the peer up before keeps that last whole decision,
        # a new one gives up on the torn entry and fails open
        with path.open("r+b") as f:
            f.seek(64)
            f.write((7).to_bytes(4, sys.byteorder))
        got = c(host="127.0.0.1", port=dport)
        assert got["sport"] in ports[2:] and got["tos"] == 40
        fresh = Client(tmp_path, path)
        clients.append(fresh)
        got = fresh(host="127.0.0.1", port=dport)
        assert got["sport"] not in ports and got["tos"] == 0
    only(c.counts(), applied=4)
    only(fresh.counts(), no_entry=1)


def test_a_table_that_appears_later_is_found(tmp_path: Path, clients: list[Client]) -> None:
    srv, ports = listener(), free_ports(8)
    dport = srv.getsockname()[1]
    path = tmp_path / "decisions"
    c = Client(tmp_path, path)
    clients.append(c)
    assert c(host="127.0.0.1", port=dport)["sport"] not in ports
    table(path, steered("127.0.0.1", dport, ports))
    end = time.monotonic() + 20  # looked for again at most once a second
    while (got := c(host="127.0.0.1", port=dport))["sport"] not in ports:
        assert time.monotonic() < end, "the table was never picked up"
        time.sleep(0.1)
    assert got["tos"] == TC
    counts = c.counts()
    assert counts.counters["applied"] == 1 and counts.counters["no-table"] >= 1


def test_a_planted_link_is_not_followed(tmp_path: Path, clients: list[Client]) -> None:
    srv, ports = listener(), free_ports(2)
    dport = srv.getsockname()[1]
    c = Client(tmp_path, table(tmp_path / "t", steered("127.0.0.1", dport, ports)))
    clients.append(c)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (c.qps / f"sock-{c.pid}").symlink_to(victim)
    assert c(host="127.0.0.1", port=dport)["sport"] == ports[0]  # steered
    assert victim.read_bytes() == b"keep"
    only(read_file(c.qps / f"sock-{c.pid}.1"), applied=1)  # counted under the next name


@pytest.mark.root
def test_on_the_wire(tmp_path: Path, clients: list[Client]) -> None:
    """Every packet the client sends carries the decided source port and TOS (tcpdump on lo)."""
    from scapy.layers.inet import IP, TCP
    from scapy.utils import rdpcap

    srv, ports = listener(), free_ports(2)
    dport = srv.getsockname()[1]
    c = Client(tmp_path, table(tmp_path / "t", steered("127.0.0.1", dport, ports)))
    clients.append(c)
    pcap = tmp_path / "lo.pcap"
    cap = subprocess.Popen(["tcpdump", "-i", "lo", "-n", "--immediate-mode", "-U", "-w",
                            str(pcap), f"tcp dst port {dport}"], stderr=subprocess.PIPE,
                           text=True)
    assert cap.stderr is not None and "listening" in cap.stderr.readline()
    try:
        got = [c(host="127.0.0.1", port=dport) for _ in range(2)]
        for _ in got:
            conn = srv.accept()[0]
            conn.close()
        time.sleep(0.3)  # let the last packets reach the capture before it stops
    finally:
        cap.send_signal(signal.SIGINT)
        cap.wait(timeout=30)
    sent = {(p[TCP].sport, p[IP].tos) for p in rdpcap(str(pcap)) if TCP in p}
    assert sent == {(ports[0], TC), (ports[1], TC)}, sent


# --- the agent's side: reading sock-<pid> files a job may have planted ---------------------

def sock_file(path: Path, pid: int, job: str, counts: dict[str, int], **over: Any) -> None:
    """A counters file as the interposer writes it; `over` replaces header fields."""
    f = {"magic": MAGIC, "version": 1, "size": 256, "pid": pid, "outcomes": len(OUTCOMES)}
    f.update(over)
    counters = [counts.get(o, 0) for o in OUTCOMES] + [0] * (16 - len(OUTCOMES))
    path.write_bytes(_REC.pack(f["magic"], f["version"], f["size"], f["pid"], f["outcomes"],
                               sum(counts.values()), job.encode(), *counters, 5,
                               f.get("accepts", 0)))


def test_records_are_read_without_trusting_them(tmp_path: Path) -> None:
    me, parent, dead = os.getpid(), os.getppid(), 2**22 + 4321  # above the default pid_max
    sock_file(tmp_path / f"sock-{me}", me, "a", {"applied": 3, "ports-busy": 1})
    sock_file(tmp_path / f"sock-{dead}", dead, "a", {"applied": 9})
    with open(tmp_path / f"sock-{parent}", "wb") as f:  # a huge file: only 256 bytes read
        f.write(_REC.pack(MAGIC, 1, 256, parent, 7, 2, b"b", 0, 2, *[0] * 14, 1, 0))
        f.truncate(1 << 30)
    bad = {1: (b"short", "shorter than the 256-byte"), 2: (bytes(256), "bad magic 0x0"),
           3: (None, "version 2"), 4: (None, "size 128"), 5: (None, "17 outcomes"),
           6: (None, "header says pid 1")}
    for n, (raw, _) in bad.items():
        path = tmp_path / f"sock-{n}"
        if raw is not None:
            path.write_bytes(raw)
    sock_file(tmp_path / "sock-3", 3, "x", {}, version=2)
    sock_file(tmp_path / "sock-4", 4, "x", {}, size=128)
    sock_file(tmp_path / "sock-5", 5, "x", {}, outcomes=17)
    sock_file(tmp_path / "sock-6", 1, "x", {})
    os.mkfifo(tmp_path / "sock-7")  # opening it must not hang the agent
    (tmp_path / "sock-8").symlink_to(tmp_path / f"sock-{me}")  # never followed
    for name in ("sock-x", "sock-\u00b2", "123", "sock-"):  # not ours: not even looked at
        (tmp_path / name).write_bytes(b"?")
    recs, problems = read_sock_dir(tmp_path)
    got = {r.pid: r for r in recs}
    assert {(r.pid, r.job_id, r.calls) for r in recs} == {(me, "a", 4), (parent, "b", 2)}
    assert got[parent].counters["tos-only"] == 2 and got[me].counters["ports-busy"] == 1
    why = sorted(p.split(": ", 1)[1] for p in problems)
    assert len(why) == 8, problems
    for _, text in bad.values():
        assert any(text in w for w in why), (text, why)
    assert any("not a regular file" in w for w in why)
    assert any("Too many levels of symbolic links" in w for w in why)
    read_sock_dir(tmp_path, prune=True)
    assert not (tmp_path / f"sock-{dead}").exists() and (tmp_path / "sock-1").exists()
    from transport.qp_records import read_dir as read_qp_dir
    assert len(read_qp_dir(tmp_path)[1]) == 1  # "123" only: sock-* and "²" are not QP files


def test_ports_busy_per_job_outlives_the_processes(tmp_path: Path) -> None:
    """The agent's per-job ports-busy count (reported to the leader) keeps what a process
    counted after it exits and its file is pruned, whether or not a scan saw it alive; a job
    that is not registered is not counted, and a deregistered job's count is dropped. A file
    counts for the job it names only when it is the job's (issue 37): a live writer in the
    job's process tree, a gone writer's file owned by the job's user."""
    dp = DataPlane(tmp_path / "decisions", sysfs_root=str(tmp_path / "nosys"))
    dp.start()
    me = os.getpid()
    mine = JobOwners(os.getuid(), frozenset({me}))  # the kids are mine: in the jobs' process trees
    kids = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        sock_file(dp.qp_dir / f"sock-{me}", me, "a", {"applied": 1, "ports-busy": 2})
        sock_file(dp.qp_dir / f"sock-{kids[0].pid}", kids[0].pid, "a", {"ports-busy": 3})
        sock_file(dp.qp_dir / f"sock-{kids[1].pid}", kids[1].pid, "b", {"ports-busy": 4})
        sock_file(dp.qp_dir / "sock-1", 1, "a", {"ports-busy": 1000})  # init names job a
        assert dp.ports_busy({"a": mine}) == {"a": 5}  # "b" is not registered here
        assert dp.last_busy == {"a": 5}
        # the child counts once more, then exits: the count stays with its job
        sock_file(dp.qp_dir / f"sock-{kids[0].pid}", kids[0].pid, "a", {"ports-busy": 4})
        gone = subprocess.Popen(["sleep", "60"])  # one never seen alive by a scan
        sock_file(dp.qp_dir / f"sock-{gone.pid}", gone.pid, "a", {"ports-busy": 10})
        other = subprocess.Popen(["sleep", "60"])  # another user's, gone: not a's
        sock_file(dp.qp_dir / f"sock-{other.pid}", other.pid, "a", {"ports-busy": 100})
        os.chown(dp.qp_dir / f"sock-{other.pid}", 65534, 65534)
        for p in (kids[0], gone, other):
            p.kill()
            p.wait()
        both = {"a": mine, "b": mine}
        assert dp.ports_busy(both) == {"a": 16, "b": 4}
        assert not (dp.qp_dir / f"sock-{kids[0].pid}").exists()
        assert dp.ports_busy(both) == {"a": 16, "b": 4}  # counted once
        assert dp.ports_busy({"b": mine}) == {"b": 4}  # "a" left
        assert dp.ports_busy(both) == {"a": 2, "b": 4}  # a new "a": its live file only
    finally:
        for p in kids:
            p.kill()
            p.wait()


def test_dataplane_sums_per_job_and_status_shows_it(tmp_path: Path) -> None:
    dp = DataPlane(tmp_path / "decisions", sysfs_root=str(tmp_path / "nosys"))
    dp.start()
    me, parent = os.getpid(), os.getppid()
    sock_file(dp.qp_dir / f"sock-{me}", me, "j", {"applied": 3, "no-table": 1})
    sock_file(dp.qp_dir / f"sock-{parent}", parent, "j", {"applied": 2, "tos-only": 5},
              accepts=4)
    rows = dp.sock_status()
    assert len(rows) == 1
    r = rows[0]
    assert (r.job_id, r.processes, r.applied, r.tos_only, r.no_table, r.calls, r.accepts) == (
        "j", 2, 5, 5, 1, 11, 4)
    console = Console(record=True, width=120)
    print_status(console, apb.LocalAgentStatus(host_id="h", sock_connects=rows), None, 0.0)
    text = console.export_text()
    assert "TCP connects" in text and "ports busy" in text
    assert [ln.split() for ln in text.splitlines() if "│ j " in ln] == [
        ["│", "j", "│", "2", "│", "5", "│", "5", "│", "0", "│", "0", "│", "1", "│", "0", "│",
         "0", "│", "4", "│"]]


@pytest.mark.slow
def test_cruxctl_status_counts_a_jobs_connects(tmp_path: Path, clients: list[Client]) -> None:
    d = Daemon(tmp_path, "h0", {
        "leader": {"listen": "127.0.0.1:0", "profiling_s": 0, "debounce_ms": 10},
        "agent": {"addresses": ["10.1.0.1"], "gpus": 8, "report_interval_s": 0.5}})
    d.start()
    try:
        d.wait_log(" applied: ")
        srv = listener()
        # the agent's own table and records directory (the interposer's default rule)
        c = Client(tmp_path, d.table, qps=d.table.parent / "qps")
        clients.append(c)
        c(host="127.0.0.1", port=srv.getsockname()[1])  # no decision for this job yet
        rows = status(d.socket)["agent"]["sock_connects"]
        assert rows == [{"job_id": JOB, "processes": 1, "applied": 0, "tos_only": 0,
                         "ports_busy": 0, "no_job": 0, "no_table": 0, "bad_table": 0,
                         "no_entry": 1, "calls": 1, "accepts": 0}]
        text = cruxctl("status", "--local", socket_path=d.socket)
        assert text.returncode == 0 and "TCP connects" in text.stdout, text.stderr
        said = " ".join(text.stdout.split())  # rich wraps the line at the terminal's width
        assert f"job {JOB}: 1 TCP connection(s) unsteered: made before the plan" in said
        c.close()
        wait_for("the exited job's counters pruned",
                 lambda: status(d.socket)["agent"]["sock_connects"] == [])
        assert not (d.table.parent / "qps" / f"sock-{c.pid}").exists()
    finally:
        assert d.stop() == 0, d.log_text()[-2000:]


def test_a_sigkilled_agent_leaves_its_last_decision_in_force(tmp_path: Path,
                                                            clients: list[Client]) -> None:
    """A real cruxd plans the job (registered by crux-run); SIGKILLed, it leaves its table,
    and the job's next connects still get the decided class."""
    d = Daemon(tmp_path, "h0", {
        "leader": {"listen": "127.0.0.1:0", "profiling_s": 0, "debounce_ms": 10},
        "agent": {"addresses": ["10.1.0.1"], "gpus": 8, "report_interval_s": 0.5}})
    d.start()
    job = None
    try:
        d.wait_log(" applied: ")
        job = crux_run(d.socket, JOB, "--flops-per-iter", "1e15")

        def decided() -> Decision | None:
            with TableReader(d.table) as t:
                return t.lookup(JOB)
        entry = wait_for("the job's decision in the table", decided)
        assert entry.traffic_class != 0  # a class a connect without crux would not carry
        srv = listener()
        c = Client(tmp_path, d.table, qps=d.table.parent / "qps")
        clients.append(c)
        assert c(host="127.0.0.1", port=srv.getsockname()[1])["tos"] == entry.traffic_class
        d.send(signal.SIGKILL)
        assert d.proc is not None and d.proc.wait(timeout=30) == -signal.SIGKILL
        got = c(host="127.0.0.1", port=srv.getsockname()[1])
        assert got["tos"] == entry.traffic_class  # the dead agent's last decision holds
        fresh = Client(tmp_path, d.table, qps=d.table.parent / "qps")  # a job started later
        clients.append(fresh)
        assert fresh(host="127.0.0.1", port=srv.getsockname()[1])["tos"] == entry.traffic_class
        only(c.counts(), tos_only=2)  # no TCP ports without probing: the class alone
    finally:
        if job is not None:
            job.kill()
            job.wait()
        d.stop()
