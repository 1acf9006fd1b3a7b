"""Hop identification for TCP flows, as `traceroute -T` does it: a SYN with the data's
5-tuple (TCP, the candidate source port, the peer's real listening port) and TTL t
expires at the t-th router, whose ICMP time-exceeded names it; the peer's SYN-ACK
(a listener) or RST (none) ends the trace. Switches hash the protocol and both ports,
so a UDP/4791 probe says nothing about where a TCP connection goes.

Same interface as `probing.ttl.TtlProber` (`trace(sport) -> hops | None`), so
`probing.sweep.sweep` drives it unchanged. Needs CAP_NET_RAW (raw ICMP and TCP sockets).

What it does to the two kernels involved:

* Ours: while a port is traced, a TCP socket is bound to it (no SO_REUSEADDR), so no
  local program takes it mid-trace, and the peer's SYN-ACK meets a port with no
  connection: our kernel answers it with a RST. A port that cannot be bound is in use
  (a job's live connection, a listener, TIME_WAIT): a SYN from it could land on a live
  connection at the peer, so it is never sent. If the port's path is known
  (`known`, from the last sweep), it is re-verified with TTLs that expire at the
  path's last router and never reach the peer; otherwise it is skipped.
* The peer's: a SYN-ACK leaves a half-open connection in the listener's SYN queue
  (never handed to accept()). The prober resets it itself, at the SYN-ACK's
  acknowledgment number, rather than rely on our kernel's RST, which a host firewall
  dropping unsolicited segments would swallow; the kernel's RST, if it comes too,
  finds nothing left to reset. Where the peer still holds the 4-tuple in TIME_WAIT (a
  job's connection from this port, closed at the peer's end first, as a ring's rebuild
  or a job's restart leaves it), about every other SYN draws a bare ACK instead of a
  SYN-ACK; the prober then asks once more with a sequence number past the one that ACK
  names, which the TIME_WAIT takes as a new connection (`_await`). Without that, half
  the re-verifications of ports a job had just used timed out, the ports were dropped,
  and each drop was a re-plan (on the testbed, a ring rebuild, and a new TIME_WAIT).

Each probe's sequence number is a random per-trace base plus its TTL: an ICMP reply
quotes it and a SYN-ACK/RST acknowledges it + 1, so a reply names the exact probe it
answers, and a late reply to an earlier TTL cannot pose as the current hop.
"""

from __future__ import annotations

import errno
import ipaddress
import secrets
import select
import socket
import time
from collections.abc import Mapping
from typing import Self

from probing import tcp_wire
from probing.icmp import TCP, TIME_EXCEEDED, UNREACHABLE, parse_reply
from probing.ttl import ProbeCounters, outside
from transport.roce import tos

ICMP_SNAP = 576  # RFC 1812 4.3.2.3: an ICMP error is at most 576 bytes
_REACHED = "reached"
_UNREACHABLE = "unreachable"


def source_address(peer: str) -> str:
    """The address this host sends to `peer` from (a route lookup; nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))
        return str(s.getsockname()[0])


class TcpTtlProber:
    """Traces one peer's TCP port `dport`; `allowed` limits whose replies count (the
    fabric's prefixes). `known`: source port -> the hops it led to in the last sweep."""

    def __init__(self, peer: str, *, dport: int, max_hops: int = 8, timeout_s: float = 0.5,
                 allowed: tuple[ipaddress.IPv4Network, ...] = (),
                 known: Mapping[int, tuple[str, ...]] | None = None, dscp: int = 0) -> None:
        if not 1 <= dport <= 65535:
            raise ValueError(f"dport must be 1..65535, got {dport}")
        if not 0 <= dscp < 64:
            raise ValueError(f"dscp must be 0..63, got {dscp}")
        self.dscp = dscp
        self.peer = str(ipaddress.IPv4Address(peer))
        self.dport = dport
        self.max_hops = max_hops
        self.timeout_s = timeout_s
        self.allowed = allowed
        self.known = dict(known or {})
        self.counters = ProbeCounters()
        self.src = source_address(self.peer)
        self._icmp, self._tcp = self._open()

    def _open(self) -> tuple[socket.socket, socket.socket]:
        """The raw ICMP socket the hops answer on, and the raw TCP socket that sends the
        SYNs and reads the peer's answer (tests replace both with socket pairs)."""
        icmp = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
        try:
            tcp = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
        except OSError:
            icmp.close()
            raise
        try:
            if self.dscp:  # the probing class, above the jobs' levels (ECMP ignores it)
                tcp.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos(self.dscp))
            tcp.bind((self.src, 0))  # the source the checksums were computed for
            tcp_wire.attach_filter(tcp, tcp_wire.answer_filter(self.peer, self.dport))
            _drain(tcp)  # what arrived before the filter was attached
        except OSError:
            icmp.close()
            tcp.close()
            raise
        return icmp, tcp

    def _send(self, segment: bytes, ttl: int) -> None:
        self._tcp.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
        self._tcp.sendto(segment, (self.peer, 0))

    def close(self) -> None:
        self._icmp.close()
        self._tcp.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def trace(self, sport: int) -> tuple[str, ...] | None:
        hold = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            hold.bind(("", sport))
        except OSError as exc:
            hold.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            return self._trace_in_use(sport)
        with hold:
            self._pin(sport)
            return self._trace(sport, self.max_hops)

    def _pin(self, sport: int | None) -> None:
        """Read only segments to `sport` from the peer's port, bare ACKs included (the
        port is ours alone while we hold it), or with None, only SYN-ACKs and RSTs."""
        tcp_wire.attach_filter(self._tcp, tcp_wire.answer_filter(self.peer, self.dport, sport))

    def _trace_in_use(self, sport: int) -> tuple[str, ...] | None:
        known = self.known.get(sport)
        if not known:
            self.counters.ignore("port in use")
            return None
        self._pin(None)  # a job's connection holds the port: its ACKs must stay out
        hops = self._trace(sport, len(known), reach=False)
        if hops is not None and hops != known:  # moved: the port's path is unknown now
            self.counters.ignore("port in use, path changed")
            return None
        return hops

    def _trace(self, sport: int, limit: int, reach: bool = True) -> tuple[str, ...] | None:
        hops: list[str] = []
        base = secrets.randbits(32)
        for ttl in range(1, limit + 1):
            seq = (base + ttl) & 0xFFFFFFFF
            self._send(tcp_wire.syn(self.src, self.peer, sport, self.dport, seq), ttl)
            self.counters.sent += 1
            got = self._await(sport, ttl, [seq])
            if got is None:
                self.counters.timeouts += 1
                self.counters.last_miss = (f"port {sport}, hop {ttl}"
                                           f"{'' if reach else ' (port in use)'}")
                return None  # a silent hop: no signature we can trust
            if got == _UNREACHABLE:
                return None
            if got == _REACHED:
                return tuple(hops)
            hops.append(got)
        return tuple(hops) if not reach else None

    def _await(self, sport: int, ttl: int, seqs: list[int]) -> str | None:
        """A hop's address, _REACHED, _UNREACHABLE, or None when nothing answered.

        A peer that still holds this 4-tuple in TIME_WAIT (a connection from this port
        closed there first) answers a SYN whose sequence number is not past the old
        connection's with a bare ACK of that connection's next number (RFC 9293 §3.10.7.4;
        Linux: about every other random ISN). That ACK proves nothing about this probe, so
        it is not the answer; but a SYN past the number it acknowledges opens a new
        connection (RFC 6191), whose SYN-ACK is: one such SYN is sent at the same TTL, and
        an answer to either counts."""
        end = time.monotonic() + self.timeout_s
        while (left := end - time.monotonic()) > 0:
            ready, _, _ = select.select([self._icmp, self._tcp], [], [], left)
            if not ready:
                break
            if self._tcp in ready:
                got = self._answered(sport, seqs)
                if got is True:
                    self.counters.replies += 1
                    return _REACHED
                if got is not False and len(seqs) == 1:
                    seqs.append((got + 1 + secrets.randbits(16)) & 0xFFFFFFFF)
                    self._send(tcp_wire.syn(self.src, self.peer, sport, self.dport, seqs[1]),
                               ttl)
                    self.counters.sent += 1
                    end = time.monotonic() + self.timeout_s
            if self._icmp in ready and (hop := self._icmp_reply(sport, seqs)) is not None:
                self.counters.replies += 1
                return hop
        return None

    def _answered(self, sport: int, seqs: list[int]) -> bool | int:
        """Whether the segment waiting on the TCP socket is the peer's answer to one of
        `seqs`; or, for a bare ACK to `sport` (a TIME_WAIT's), the number it acknowledges."""
        try:
            data = self._tcp.recv(tcp_wire.SNAP)
        except OSError:
            return False
        s = tcp_wire.parse_segment(data)
        if s is None:
            self.counters.ignore("malformed")
            return False
        if (s.src, s.sport, s.dst, s.dport) != (self.peer, self.dport, self.src, sport):
            self.counters.ignore("not ours")
            return False
        if s.flags & (tcp_wire.SYN | tcp_wire.RST | tcp_wire.FIN | tcp_wire.ACK) == tcp_wire.ACK:
            self.counters.ignore("the peer's TIME_WAIT acknowledged")
            return s.ack
        ack = next((a for a in ((q + 1) & 0xFFFFFFFF for q in seqs) if a == s.ack), None)
        if ack is None or not (s.syn_ack or s.reset):
            self.counters.ignore("not ours")
            return False
        if s.syn_ack:  # end the peer's half-open connection now (see the module doc)
            try:
                self._send(tcp_wire.reset(self.src, self.peer, sport, self.dport, ack), 64)
            except OSError:  # a local firewall refused it (EPERM): the trace still stands
                self.counters.ignore("reset not sent")
        return True

    def _icmp_reply(self, sport: int, seqs: list[int]) -> str | None:
        data, _ = self._icmp.recvfrom(ICMP_SNAP)
        reply = parse_reply(data, TCP)
        if reply is None:
            self.counters.ignore("malformed or not TCP")
            return None
        if (reply.dst, reply.sport, reply.dport) != (self.peer, sport, self.dport):
            self.counters.ignore("not ours")
            return None
        if reply.seq not in seqs:
            self.counters.ignore("late or not ours")
            return None
        if outside(reply.responder, self.allowed):
            self.counters.ignore("outside the fabric")
            return None
        if reply.type == TIME_EXCEEDED:
            return reply.responder
        if reply.type == UNREACHABLE:
            # from the peer itself (a firewall's administratively prohibited, say) it
            # still ends the trace; from a router the path is cut short: no signature
            if reply.responder == self.peer:
                return _REACHED
            self.counters.ignore("unreachable")
            return _UNREACHABLE
        self.counters.ignore("other ICMP")
        return None


def _drain(sock: socket.socket) -> None:
    sock.setblocking(False)
    try:
        while True:
            sock.recv(tcp_wire.SNAP)
    except BlockingIOError:
        pass
    finally:
        sock.setblocking(True)
