"""ICMP replies to UDP and TCP probes, decoded defensively (any bytes in, never an
exception).

A probe's reply quotes the probe's IP header and at least the first 8 bytes of its
transport header (RFC 792), which is how a reply is matched to the probe that caused
it: destination address, source port and destination port must all be ours. For TCP
those 8 bytes also hold the sequence number, which the TCP prober uses as a nonce.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

TIME_EXCEEDED = 11
UNREACHABLE = 3
PORT_UNREACHABLE = 3
TCP = 6
UDP = 17


@dataclass(frozen=True, slots=True)
class IcmpReply:
    responder: str  # who sent the ICMP (a router's interface, or the peer)
    type: int
    code: int
    dst: str  # the probe's destination, from the quoted header
    sport: int
    dport: int
    ttl_left: int  # TTL of the quoted probe as the responder saw it
    proto: int = UDP  # the quoted probe's protocol
    seq: int = 0  # TCP: the quoted sequence number (UDP: 0)

    @property
    def expired(self) -> bool:
        return self.type == TIME_EXCEEDED

    @property
    def reached(self) -> bool:
        return self.type == UNREACHABLE and self.code == PORT_UNREACHABLE


def parse_reply(packet: bytes, proto: int = UDP) -> IcmpReply | None:
    """An IPv4 packet as a raw ICMP socket returns it; None unless it is a well-formed
    time-exceeded or destination-unreachable quoting a probe of protocol `proto`
    (UDP or TCP): a UDP prober must never take a TCP probe's reply for its own."""
    try:
        if len(packet) < 20 or packet[0] >> 4 != 4:
            return None
        ihl = (packet[0] & 0x0F) * 4
        if ihl < 20 or len(packet) < ihl + 8 + 20 + 8:
            return None
        responder = str(ipaddress.IPv4Address(packet[12:16]))
        kind, code = packet[ihl], packet[ihl + 1]
        if kind not in (TIME_EXCEEDED, UNREACHABLE):
            return None
        inner = packet[ihl + 8:]
        if inner[0] >> 4 != 4:
            return None
        iihl = (inner[0] & 0x0F) * 4
        if iihl < 20 or len(inner) < iihl + 8 or inner[9] != proto or proto not in (UDP, TCP):
            return None
        sport, dport, word = struct.unpack_from("!HHI", inner, iihl)
        dst = str(ipaddress.IPv4Address(inner[16:20]))
        return IcmpReply(responder, kind, code, dst, sport, dport, inner[8], proto,
                         word if proto == TCP else 0)
    except (IndexError, struct.error, ValueError):
        return None
