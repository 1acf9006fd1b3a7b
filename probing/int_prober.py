"""Hop identification by INT: one UDP probe from the data's source port collects each
INT-capable switch's node id on its way to the peer, whose ProbeResponder echoes the
stack back. One round trip per port instead of TTL's one per hop, and no raw socket.

Hops are returned as "node:<decimal node id>" (the id a switch is administratively
given, unique within the INT domain, spec v2.1 §4.1), so INT and TTL signatures
(IP addresses) never compare equal by accident.
"""

from __future__ import annotations

import ipaddress
import secrets
import select
import socket
import time

from probing import int_md
from probing.ttl import ProbeCounters, outside
from transport.roce import ROCE_DPORT, tos


def hop_name(node_id: int) -> str:
    return f"node:{node_id}"


class IntProber:
    """Traces one peer with INT-MD probes. None from `trace` means: no echo, or one
    that cannot be trusted as a path signature: the stack is empty (no INT-capable
    hop: fall back to TTL, counted as "no INT hops"), or a hop could not push its
    metadata (E: more hops than `max_hops`; M: an egress MTU), so hops are missing.
    `allowed` limits whose echoes count (the fabric's prefixes); `dscp` is set on the
    probes, for a fabric that flags INT by DSCP (spec §5.7.2, option 2)."""

    def __init__(self, peer: str, *, dport: int = ROCE_DPORT, max_hops: int = 8,
                 timeout_s: float = 0.5, instructions: int = int_md.NODE_ID, dscp: int = 0,
                 bind_addr: str = "",
                 allowed: tuple[ipaddress.IPv4Network, ...] = ()) -> None:
        self.peer = str(ipaddress.IPv4Address(peer))
        self.dport = dport
        self.max_hops = max_hops
        self.timeout_s = timeout_s
        self.instructions = instructions
        self.dscp = dscp
        self.bind_addr = bind_addr
        self.allowed = allowed
        self.counters = ProbeCounters()
        # fail at construction, not on the first probe, if the options cannot be built
        int_md.build_probe(max_hops=max_hops, instructions=instructions, nonce=0, dscp=dscp)

    def close(self) -> None:
        """Nothing to release: each trace owns its socket (bound to that trace's port)."""

    def __enter__(self) -> IntProber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def trace(self, sport: int) -> tuple[str, ...] | None:
        nonce = secrets.randbits(64)  # unguessable: an off-path sender cannot forge a path
        probe = int_md.build_probe(max_hops=self.max_hops, instructions=self.instructions,
                                   nonce=nonce, dscp=self.dscp)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.dscp:
                udp.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos(self.dscp))
            try:
                udp.bind((self.bind_addr, sport))
            except OSError:  # someone else holds the port: this port goes unanswered
                self.counters.ignore("source port busy")
                return None
            udp.sendto(probe, (self.peer, self.dport))
            self.counters.sent += 1
            report = self._await(udp, nonce)
        if report is None:
            return None
        if report.exceeded or report.mtu_exceeded:
            self.counters.ignore("hops missing")  # a prefix of the path is no signature
            return None
        if not report.records:
            self.counters.ignore("no INT hops")
            return None
        return tuple(hop_name(h) for h in report.hops)

    def _await(self, udp: socket.socket, nonce: int) -> int_md.IntReport | None:
        end = time.monotonic() + self.timeout_s
        while (left := end - time.monotonic()) > 0:
            ready, _, _ = select.select([udp], [], [], left)
            if not ready:
                break
            try:
                data, (host, _port) = udp.recvfrom(int_md.MAX_PAYLOAD + 1)
            except OSError:  # e.g. ICMP port unreachable surfaced on the socket
                self.counters.ignore("receive error")
                continue
            if host != self.peer:
                self.counters.ignore("not ours")
                continue
            if outside(host, self.allowed):
                self.counters.ignore("outside the fabric")
                continue
            report = int_md.parse(data)
            if report is None:
                self.counters.ignore("malformed")
                continue
            if not report.echo:
                self.counters.ignore("not an echo")
                continue
            if report.nonce != nonce:
                self.counters.ignore("wrong nonce")  # a late echo of an earlier probe, or forged
                continue
            self.counters.replies += 1
            return report
        self.counters.timeouts += 1
        return None

