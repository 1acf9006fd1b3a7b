"""Hop identification by TTL expiry: a UDP probe with the data's 5-tuple and TTL t
expires at the t-th router, whose ICMP time-exceeded names it. The trace ends at
the peer: its ICMP port unreachable, or, where a crux probe responder holds the
port, the responder's echo of the probe (same size, marker TTL_ECHO). Needs
CAP_NET_RAW for the raw ICMP socket.
"""

from __future__ import annotations

import ipaddress
import secrets
import select
import socket
import time
from dataclasses import dataclass, field

from probing.icmp import IcmpReply, parse_reply
from transport.roce import ROCE_DPORT, tos

TTL_PROBE = b"crux-ttl"  # + 8-byte nonce: a TTL probe's payload
TTL_ECHO = b"crux-tte"  # the responder's answer to one that reached it


def ttl_echo_of(payload: bytes) -> bytes | None:
    """The responder's answer to a TTL probe payload; None if it is not one."""
    if len(payload) == len(TTL_PROBE) + 8 and payload.startswith(TTL_PROBE):
        return TTL_ECHO + payload[len(TTL_PROBE):]
    return None


# the peer's responder echoed the probe: the trace is complete
REACHED = IcmpReply("", 0, 0, "", 0, 0, 0)


def outside(address: str, allowed: tuple[ipaddress.IPv4Network, ...]) -> bool:
    """Whether a reply from `address` falls outside the fabric (`allowed` empty: no limit)."""
    return bool(allowed) and not any(ipaddress.IPv4Address(address) in net for net in allowed)


@dataclass
class ProbeCounters:
    sent: int = 0
    replies: int = 0
    ignored: int = 0  # not ours, malformed, or from outside the fabric
    timeouts: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    last_miss: str = ""  # the latest timeout: which source port, at which hop

    def ignore(self, why: str) -> None:
        self.ignored += 1
        self.reasons[why] = self.reasons.get(why, 0) + 1


class TtlProber:
    """Traces one peer; `allowed` limits whose replies count (the fabric's prefixes)."""

    def __init__(self, peer: str, *, dport: int = ROCE_DPORT, max_hops: int = 8,
                 timeout_s: float = 0.5,
                 allowed: tuple[ipaddress.IPv4Network, ...] = (), dscp: int = 0) -> None:
        if not 0 <= dscp < 64:
            raise ValueError(f"dscp must be 0..63, got {dscp}")
        self.peer = str(ipaddress.IPv4Address(peer))
        self.dscp = dscp
        self.dport = dport
        self.max_hops = max_hops
        self.timeout_s = timeout_s
        self.allowed = allowed
        self.counters = ProbeCounters()
        self._icmp = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)

    def close(self) -> None:
        self._icmp.close()

    def __enter__(self) -> TtlProber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def trace(self, sport: int) -> tuple[str, ...] | None:
        hops: list[str] = []
        nonce = secrets.token_bytes(8)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.dscp:  # the probing class, above the jobs' levels (ECMP ignores it)
                udp.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos(self.dscp))
            udp.bind(("", sport))
            for ttl in range(1, self.max_hops + 1):
                udp.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
                udp.sendto(TTL_PROBE + nonce, (self.peer, self.dport))
                self.counters.sent += 1
                reply = self._await(sport, udp, TTL_ECHO + nonce)
                if reply is None:
                    self.counters.timeouts += 1
                    self.counters.last_miss = f"port {sport}, hop {ttl}"
                    return None  # a silent hop: no signature we can trust
                if reply is REACHED or reply.reached:
                    return tuple(hops)
                hops.append(reply.responder)
        return None

    def _echoed(self, udp: socket.socket, echo: bytes) -> bool:
        try:
            data, (host, port) = udp.recvfrom(64)
        except OSError:  # e.g. an ICMP error queued on the socket; the raw socket has it
            return False
        if (host, port) == (self.peer, self.dport) and data == echo:
            return True
        self.counters.ignore("not ours")
        return False

    def _await(self, sport: int, udp: socket.socket, echo: bytes) -> IcmpReply | None:
        end = time.monotonic() + self.timeout_s
        while (left := end - time.monotonic()) > 0:
            ready, _, _ = select.select([self._icmp, udp], [], [], left)
            if not ready:
                break
            if udp in ready and self._echoed(udp, echo):
                self.counters.replies += 1
                return REACHED
            if self._icmp not in ready:
                continue
            data, _ = self._icmp.recvfrom(2048)
            reply = parse_reply(data)
            if reply is None:
                self.counters.ignore("malformed")
                continue
            if (reply.dst, reply.sport, reply.dport) != (self.peer, sport, self.dport):
                self.counters.ignore("not ours")
                continue
            if outside(reply.responder, self.allowed):
                self.counters.ignore("outside the fabric")
                continue
            if not (reply.expired or reply.reached):
                self.counters.ignore("other ICMP")
                continue
            self.counters.replies += 1
            return reply
        return None
