"""The TCP TTL prober's pure parts and its reply logic.

Golden packets are built with scapy, independently of probing/tcp_wire.py: the SYN and
RST the prober sends, the peer's SYN-ACK, ICMP time-exceeded quoting a TCP probe. The
prober's matching runs against scripted replies on socket pairs (no root needed): the
real thing runs on the namespace rig in test_tcp_probing_rig.py."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scapy.layers.inet import ICMP, IP, TCP, UDP

from probing import tcp_wire
from probing.icmp import TCP as TCP_PROTO
from probing.icmp import parse_reply
from probing.tcp_ttl import TcpTtlProber

SRC, PEER = "127.0.0.1", "127.0.0.2"  # loopback: source_address() works anywhere
ROUTERS = ["10.3.0.2", "10.3.1.2", "10.3.32.1"]


def test_syn_and_rst_match_scapy_byte_for_byte() -> None:
    syn = IP(src=SRC, dst=PEER) / TCP(sport=61000, dport=5201, seq=0x12345678, flags="S",
                                      window=64240, options=[("MSS", 1460)])
    assert tcp_wire.syn(SRC, PEER, 61000, 5201, 0x12345678) == bytes(syn)[20:]
    rst = IP(src=SRC, dst=PEER) / TCP(sport=61000, dport=5201, seq=0xFFFFFFFF, flags="R",
                                      window=0)
    assert tcp_wire.reset(SRC, PEER, 61000, 5201, 0xFFFFFFFF) == bytes(rst)[20:]
    # a segment's checksum over its pseudo-header sums to zero (RFC 1071)
    seg = tcp_wire.syn(SRC, PEER, 1, 2, 3)
    pseudo = struct.pack("!4s4sBBH", ipaddress.IPv4Address(SRC).packed,
                         ipaddress.IPv4Address(PEER).packed, 0, 6, len(seg))
    assert tcp_wire.checksum(pseudo + seg) == 0
    with pytest.raises(ValueError):
        tcp_wire.segment(SRC, PEER, 1, 2, 3, 0, tcp_wire.SYN, options=b"\x01")


def test_parse_segment_golden() -> None:
    synack = bytes(IP(src=PEER, dst=SRC, options=[b"\x01\x01\x01\x01"]) /
                   TCP(sport=5201, dport=61000, seq=777, ack=0x12345679, flags="SA"))
    s = tcp_wire.parse_segment(synack)
    assert s is not None and s.syn_ack and not s.reset
    assert (s.src, s.dst, s.sport, s.dport, s.seq, s.ack) == (PEER, SRC, 5201, 61000, 777,
                                                              0x12345679)
    rst = tcp_wire.parse_segment(bytes(IP(src=PEER, dst=SRC) /
                                       TCP(sport=5201, dport=61000, flags="RA", ack=9)))
    assert rst is not None and rst.reset and not rst.syn_ack
    frag = bytes(IP(src=PEER, dst=SRC, frag=10, proto=6) / bytes(20))
    assert tcp_wire.parse_segment(frag) is None  # not a first fragment: no TCP header
    assert tcp_wire.parse_segment(synack[:39]) is None  # truncated header
    assert tcp_wire.parse_segment(bytes(IP(src=PEER, dst=SRC) / UDP())) is None


def _quote(probe: bytes, kind: int = 11, code: int = 0, router: str = ROUTERS[0],
           keep: int = 28) -> bytes:
    return bytes(IP(src=router, dst=SRC) / ICMP(type=kind, code=code) / probe[:keep])


def test_icmp_quoting_a_tcp_probe_golden() -> None:
    probe = bytes(IP(src=SRC, dst=PEER, ttl=1) /
                  TCP(sport=61000, dport=5201, seq=0xDEADBEEF, flags="S"))
    for keep in (28, len(probe)):  # RFC 792's 8 bytes, and Linux's whole header
        r = parse_reply(_quote(probe, keep=keep), TCP_PROTO)
        assert r is not None and r.expired and r.proto == TCP_PROTO
        assert (r.responder, r.dst, r.sport, r.dport, r.seq, r.ttl_left) == (
            ROUTERS[0], PEER, 61000, 5201, 0xDEADBEEF, 1)
    # the UDP prober never takes a TCP probe's reply for its own, nor the other way round
    assert parse_reply(_quote(probe)) is None
    udp = bytes(IP(src=SRC, dst=PEER, ttl=1) / UDP(sport=61000, dport=5201) / b"x")
    assert parse_reply(_quote(udp), TCP_PROTO) is None and parse_reply(_quote(udp)) is not None
    assert parse_reply(_quote(probe, keep=27), TCP_PROTO) is None  # too short a quote
    assert parse_reply(_quote(probe), 1) is None  # only UDP and TCP quotes


@given(st.binary(max_size=200))
def test_any_bytes_never_raise(data: bytes) -> None:
    s = tcp_wire.parse_segment(data)
    assert s is None or 0 <= s.sport <= 65535
    r = parse_reply(data, TCP_PROTO)
    assert r is None or 0 <= r.seq < 2**32


# --- the prober's logic against scripted replies ------------------------------------------
Reply = tuple[str, bytes]  # ("icmp" | "tcp", an IPv4 packet)
Script = Callable[[int, int, int], list[Reply]]  # (ttl, seq, sport) -> replies


def synack(sport: int, seq: int, dport: int = 5201, flags: str = "SA") -> bytes:
    return bytes(IP(src=PEER, dst=SRC) / TCP(sport=dport, dport=sport, seq=4242,
                                             ack=(seq + 1) % 2**32, flags=flags))


def expired(ttl: int, seq: int, sport: int, router: str | None = None,
            kind: int = 11) -> bytes:
    probe = bytes(IP(src=SRC, dst=PEER, ttl=1) / TCP(sport=sport % 65536, dport=5201,
                                                     seq=seq % 2**32, flags="S"))
    return _quote(probe, kind=kind, router=router or ROUTERS[min(ttl, 3) - 1])


def clos(ttl: int, seq: int, sport: int) -> list[Reply]:
    """Three routers, then a listener."""
    return [("icmp", expired(ttl, seq, sport))] if ttl <= 3 else [("tcp", synack(sport, seq))]


class Scripted(TcpTtlProber):
    """The prober with its raw sockets replaced by socket pairs fed by a script."""

    def __init__(self, script: Script, **kw: object) -> None:
        self.script = script
        self.sent: list[tuple[int, tcp_wire.Segment]] = []
        super().__init__(PEER, dport=5201, timeout_s=0.05, **kw)  # type: ignore[arg-type]

    def _pin(self, sport: int | None) -> None:  # the kernel's filter: its own test below
        self.pins.append(sport)

    def _open(self) -> tuple[socket.socket, socket.socket]:
        self.pins: list[int | None] = []
        self.far_icmp, icmp = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.far_tcp, tcp = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        return icmp, tcp

    def _send(self, segment: bytes, ttl: int) -> None:
        seg = tcp_wire.parse_segment(bytes(IP(src=SRC, dst=PEER, proto=6) / segment))
        assert seg is not None
        self.sent.append((ttl, seg))
        if seg.flags & tcp_wire.SYN:
            for kind, data in self.script(ttl, seg.seq, seg.sport):
                (self.far_icmp if kind == "icmp" else self.far_tcp).send(data)

    def close(self) -> None:
        super().close()
        self.far_icmp.close()
        self.far_tcp.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def test_trace_reads_hops_and_resets_the_half_open_connection() -> None:
    port = free_port()
    with Scripted(clos) as p:
        assert p.trace(port) == tuple(ROUTERS)
        syns = [(ttl, s) for ttl, s in p.sent if s.flags == tcp_wire.SYN]
        assert [ttl for ttl, _ in syns] == [1, 2, 3, 4]
        assert all((s.sport, s.dport, s.dst) == (port, 5201, PEER) for _, s in syns)
        base = syns[0][1].seq - 1  # seq = per-trace base + TTL
        assert [s.seq for _, s in syns] == [(base + t) % 2**32 for t in (1, 2, 3, 4)]
        # the SYN-ACK drew our own RST at its ack number, ending the peer's SYN_RECV
        _, rst = p.sent[-1]
        assert rst.flags == tcp_wire.RST and rst.seq == (syns[-1][1].seq + 1) % 2**32
        assert (p.counters.sent, p.counters.replies, p.counters.ignored) == (4, 4, 0)


def test_a_peer_without_listener_answers_rst_and_that_ends_the_trace_too() -> None:
    def no_listener(ttl: int, seq: int, sport: int) -> list[Reply]:
        return clos(ttl, seq, sport) if ttl <= 3 else [("tcp", synack(sport, seq, flags="RA"))]

    with Scripted(no_listener) as p:
        assert p.trace(free_port()) == tuple(ROUTERS)
        assert not any(s.flags & tcp_wire.RST for _, s in p.sent)  # nothing to reset


def test_replies_not_ours_are_ignored_and_counted() -> None:
    def noisy(ttl: int, seq: int, sport: int) -> list[Reply]:
        out: list[Reply] = [
            ("icmp", expired(ttl, seq + 7, sport)),  # another probe's sequence number
            ("icmp", expired(ttl, seq, sport + 1)),  # another source port
            ("icmp", b"\x45garbage"),
            ("tcp", synack(sport, seq + 1)),  # acknowledges another probe
            ("tcp", synack(sport, seq, dport=5202)),  # another port of the peer
            ("tcp", synack(sport, seq, flags="A")),  # an ACK, not an answer to a SYN
        ]
        if ttl > 1:  # a late reply to the previous TTL cannot pose as this hop
            out.append(("icmp", expired(ttl - 1, seq - 1, sport)))
        return out + clos(ttl, seq, sport)

    with Scripted(noisy) as p:
        assert p.trace(free_port()) == tuple(ROUTERS)
        assert p.counters.ignored >= 4 * 6 and p.counters.replies == 4


def test_silence_unreachable_and_outside_the_fabric_give_no_signature() -> None:
    def silent_hop(ttl: int, seq: int, sport: int) -> list[Reply]:
        return [] if ttl == 2 else clos(ttl, seq, sport)

    with Scripted(silent_hop) as p:
        assert p.trace(free_port()) is None and p.counters.timeouts == 1

    def cut(ttl: int, seq: int, sport: int) -> list[Reply]:  # a router: net unreachable
        return [("icmp", expired(ttl, seq, sport, kind=3))] if ttl == 2 else clos(ttl, seq,
                                                                                   sport)

    with Scripted(cut) as p:
        assert p.trace(free_port()) is None and p.counters.reasons == {"unreachable": 1}

    def prohibited(ttl: int, seq: int, sport: int) -> list[Reply]:  # the peer's firewall
        if ttl == 4:
            return [("icmp", expired(ttl, seq, sport, router=PEER, kind=3))]
        return clos(ttl, seq, sport)

    with Scripted(prohibited) as p:
        assert p.trace(free_port()) == tuple(ROUTERS)

    inside = (ipaddress.IPv4Network("10.3.0.0/24"),)  # 10.3.1.2 and 10.3.32.1 are outside
    with Scripted(clos, allowed=inside) as p:
        assert p.trace(free_port()) is None
        assert p.counters.reasons == {"outside the fabric": 1}


def test_a_port_in_use_is_never_sent_to_the_peer() -> None:
    with socket.socket() as job:  # a job's socket holds the port
        job.bind(("", 0))
        port = job.getsockname()[1]
        with Scripted(clos) as p:  # unknown port: skipped, nothing sent
            assert p.trace(port) is None and p.sent == []
            assert p.counters.reasons == {"port in use": 1}
        # a known port is re-verified with TTLs that expire before the peer
        with Scripted(clos, known={port: tuple(ROUTERS)}) as p:
            assert p.trace(port) == tuple(ROUTERS)
            assert [ttl for ttl, _ in p.sent] == [1, 2, 3]
        assert p.pins == [None]  # the job's own ACKs stay out of the prober's socket
        moved = ("10.2.0.1", "10.3.9.2", "10.3.41.1")
        with Scripted(clos, known={port: moved}) as p:
            assert p.trace(port) is None
            assert p.counters.reasons == {"port in use, path changed": 1}
    with Scripted(clos, known={port: tuple(ROUTERS)}) as p:  # free again: a full trace
        assert p.trace(port) == tuple(ROUTERS) and len(p.sent) == 5


def test_a_peer_in_time_wait_is_asked_again_past_the_number_it_acknowledges() -> None:
    """The peer holds the 4-tuple in TIME_WAIT: a SYN not past its next expected number
    draws a bare ACK of that number, a SYN past it a SYN-ACK (a new connection)."""
    rcv_nxt: list[int] = []

    def time_wait(ttl: int, seq: int, sport: int) -> list[Reply]:
        if ttl <= 3:
            return clos(ttl, seq, sport)
        if not rcv_nxt:
            rcv_nxt.append((seq + 1000) % 2**32)  # the first SYN is not past it
        if 0 < (seq - rcv_nxt[0]) % 2**32 < 2**31:
            return [("tcp", synack(sport, seq))]
        ack = bytes(IP(src=PEER, dst=SRC) / TCP(sport=5201, dport=sport, seq=77,
                                                ack=rcv_nxt[0], flags="A"))
        return [("tcp", ack)]

    port = free_port()
    with Scripted(time_wait) as p:
        assert p.trace(port) == tuple(ROUTERS)
        assert p.pins == [port]  # the port is held: bare ACKs to it may pass
        last = [s for ttl, s in p.sent if ttl == 4 and s.flags == tcp_wire.SYN]
        assert len(last) == 2 and 0 < (last[1].seq - rcv_nxt[0]) % 2**32 < 2**16 + 2
        _, rst = p.sent[-1]  # the new connection's half-open end is reset
        assert rst.flags == tcp_wire.RST and rst.seq == (last[1].seq + 1) % 2**32
        assert p.counters.timeouts == 0

    def stubborn(ttl: int, seq: int, sport: int) -> list[Reply]:  # ACKs every SYN
        if ttl <= 3:
            return clos(ttl, seq, sport)
        return [("tcp", bytes(IP(src=PEER, dst=SRC) / TCP(sport=5201, dport=sport,
                                                          ack=seq, flags="A")))]

    with Scripted(stubborn) as p:  # asked again once, not forever
        assert p.trace(free_port()) is None and p.counters.timeouts == 1
        assert len([s for ttl, s in p.sent if ttl == 4]) == 2


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        TcpTtlProber(PEER, dport=0)  # refused before any socket is opened
    with pytest.raises(ValueError):
        TcpTtlProber("not an address", dport=5201)


def _drain_raw(raw: socket.socket) -> list[tcp_wire.Segment]:
    out = []
    while True:
        try:
            data = raw.recv(4096)
        except BlockingIOError:
            return out
        seg = tcp_wire.parse_segment(data)
        if seg is not None:
            out.append(seg)


@pytest.mark.root
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="a raw TCP socket needs root (CAP_NET_RAW)")
def test_the_answer_filter_keeps_a_live_connections_segments_out() -> None:
    """A job's connection to the probed peer port sends ACKs and data from that port; the
    prober's socket must see only what can answer a probe (SYN-ACK, RST)."""
    with socket.create_server((PEER, 0)) as srv:
        port = srv.getsockname()[1]
        with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP) as raw:
            tcp_wire.attach_filter(raw, tcp_wire.answer_filter(PEER, port))
            raw.setblocking(False)
            with socket.create_connection((PEER, port)) as cli:
                conn, _ = srv.accept()
                with conn:
                    handshake = _drain_raw(raw)  # its SYN-ACK passes
                    assert handshake and all(s.flags & 0x02 for s in handshake)
                    for _ in range(50):  # data and ACKs from the peer port
                        conn.sendall(bytes(1000))
                        cli.recv(4096)
                    time.sleep(0.1)
                    assert _drain_raw(raw) == []


@pytest.mark.root
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="a raw TCP socket needs root (CAP_NET_RAW)")
def test_ports_the_peer_holds_in_time_wait_are_traced() -> None:
    """The real kernel: each port's last connection is closed at the listener's end
    first, so the listener holds it in TIME_WAIT when the probe comes (before the fix,
    about half of these traces timed out on the bare ACK)."""
    with socket.create_server((PEER, 0)) as srv:
        port = srv.getsockname()[1]
        sports = []
        for _ in range(12):
            with socket.socket() as cli:
                cli.bind((SRC, 0))
                cli.connect((PEER, port))
                conn, _ = srv.accept()
                conn.close()  # the listener's end first: TIME_WAIT stays there
                assert cli.recv(1) == b""
                sports.append(cli.getsockname()[1])
        with TcpTtlProber(PEER, dport=port, timeout_s=0.5) as p:
            assert [p.trace(s) for s in sports] == [()] * len(sports)  # reached at once
            assert p.counters.timeouts == 0
