"""Hop identification by TTL expiry: a UDP probe with the data's 5-tuple and TTL t
expires at the t-th router, whose ICMP time-exceeded names it; the peer's port
unreachable ends the trace. Needs CAP_NET_RAW for the raw ICMP socket.
"""

from __future__ import annotations

import ipaddress
import select
import socket
import time
from dataclasses import dataclass, field

from probing.icmp import IcmpReply, parse_reply
from probing.sweep import ROCE_DPORT


@dataclass
class ProbeCounters:
    sent: int = 0
    replies: int = 0
    ignored: int = 0  # not ours, malformed, or from outside the fabric
    timeouts: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def ignore(self, why: str) -> None:
        self.ignored += 1
        self.reasons[why] = self.reasons.get(why, 0) + 1


class TtlProber:
    """Traces one peer; `allowed` limits whose replies count (the fabric's prefixes)."""

    def __init__(self, peer: str, *, dport: int = ROCE_DPORT, max_hops: int = 8,
                 timeout_s: float = 0.5,
                 allowed: tuple[ipaddress.IPv4Network, ...] = ()) -> None:
        self.peer = str(ipaddress.IPv4Address(peer))
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
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            udp.bind(("", sport))
            for ttl in range(1, self.max_hops + 1):
                udp.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
                udp.sendto(b"crux-probe", (self.peer, self.dport))
                self.counters.sent += 1
                reply = self._await(sport)
                if reply is None:
                    self.counters.timeouts += 1
                    return None  # a silent hop: no signature we can trust
                if reply.reached:
                    return tuple(hops)
                hops.append(reply.responder)
        return None

    def _await(self, sport: int) -> IcmpReply | None:
        end = time.monotonic() + self.timeout_s
        while (left := end - time.monotonic()) > 0:
            ready, _, _ = select.select([self._icmp], [], [], left)
            if not ready:
                break
            data, _ = self._icmp.recvfrom(2048)
            reply = parse_reply(data)
            if reply is None:
                self.counters.ignore("malformed")
                continue
            if (reply.dst, reply.sport, reply.dport) != (self.peer, sport, self.dport):
                self.counters.ignore("not ours")
                continue
            if self.allowed and not any(ipaddress.IPv4Address(reply.responder) in net
                                        for net in self.allowed):
                self.counters.ignore("outside the fabric")
                continue
            if not (reply.expired or reply.reached):
                self.counters.ignore("other ICMP")
                continue
            self.counters.replies += 1
            return reply
        return None
