"""TCP segments for the TCP TTL prober, built and read by hand (RFC 9293 §3.1).

The prober sends from a raw IPPROTO_TCP socket, so the kernel writes the IP header
and we write the TCP header, checksum included (the kernel does not checksum a raw
socket's payload). Replies are read from the same socket, which sees every TCP
segment this host receives: `answer_filter` is a classic BPF program that keeps only
segments from the peer's probed port (to the traced port, or answers to a SYN) and
truncates them, so a busy host (a job moving gigabytes over TCP) neither floods the
prober nor makes it read much.
Parsing never raises: any bytes in, a segment or None out.
"""

from __future__ import annotations

import ctypes
import ipaddress
import socket
import struct
from dataclasses import dataclass

FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10
MSS = 1460  # the option a real SYN carries: a probe should look like the data's SYN
WINDOW = 64240
SNAP = 128  # bytes of a reply the filter lets through: IP (<= 60) + TCP (<= 60) headers
SO_ATTACH_FILTER = 26  # asm-generic/socket.h (same value on every Linux architecture)


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of `data`."""
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def segment(src: str, dst: str, sport: int, dport: int, seq: int, ack: int, flags: int,
            *, window: int = WINDOW, options: bytes = b"") -> bytes:
    """A TCP header (no payload) with its checksum over the IPv4 pseudo-header."""
    if len(options) % 4 or len(options) > 40:
        raise ValueError("TCP options must be padded to 4 bytes, at most 40")
    offset = (20 + len(options)) // 4
    head = struct.pack("!HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF,
                       offset << 4, flags, window, 0, 0) + options
    pseudo = struct.pack("!4s4sBBH", ipaddress.IPv4Address(src).packed,
                         ipaddress.IPv4Address(dst).packed, 0, socket.IPPROTO_TCP, len(head))
    csum = checksum(pseudo + head)
    return head[:16] + struct.pack("!H", csum) + head[18:]


def syn(src: str, dst: str, sport: int, dport: int, seq: int) -> bytes:
    return segment(src, dst, sport, dport, seq, 0, SYN, options=struct.pack("!BBH", 2, 4, MSS))


def reset(src: str, dst: str, sport: int, dport: int, seq: int) -> bytes:
    """The RST that ends the peer's half-open connection after its SYN-ACK: `seq` is the
    SYN-ACK's acknowledgment number (our ISN + 1), the one sequence number the peer's
    SYN_RECV state accepts a reset at (RFC 9293 §3.10.7.4)."""
    return segment(src, dst, sport, dport, seq, 0, RST, window=0)


@dataclass(frozen=True, slots=True)
class Segment:
    src: str
    dst: str
    sport: int
    dport: int
    seq: int
    ack: int
    flags: int

    @property
    def syn_ack(self) -> bool:
        return self.flags & (SYN | ACK | RST) == SYN | ACK

    @property
    def reset(self) -> bool:
        return bool(self.flags & RST)


def parse_segment(packet: bytes) -> Segment | None:
    """An IPv4 packet as a raw TCP socket returns it (IP header first); None unless it is
    a first fragment carrying at least a whole fixed TCP header."""
    try:
        if len(packet) < 20 or packet[0] >> 4 != 4 or packet[9] != socket.IPPROTO_TCP:
            return None
        ihl = (packet[0] & 0x0F) * 4
        frag = struct.unpack_from("!H", packet, 6)[0] & 0x1FFF
        if ihl < 20 or frag or len(packet) < ihl + 20:
            return None
        sport, dport, seq, ack, _, flags = struct.unpack_from("!HHIIBB", packet, ihl)
        return Segment(str(ipaddress.IPv4Address(packet[12:16])),
                       str(ipaddress.IPv4Address(packet[16:20])), sport, dport, seq, ack, flags)
    except (IndexError, struct.error, ValueError):
        return None


# classic BPF opcodes (linux/bpf_common.h)
_LD_W_ABS, _LDX_B_MSH, _LD_H_IND, _JEQ_K, _RET_K = 0x20, 0xB1, 0x48, 0x15, 0x06
_LD_B_IND, _JSET_K = 0x50, 0x45
_SYN_OR_RST = 0x06  # TCP flags: an answer to a SYN carries one of them


def answer_filter(peer: str, peer_port: int,
                  port: int | None = None) -> list[tuple[int, int, int, int]]:
    """A socket filter for a raw IPv4 TCP socket (it sees packets from the IP header):
    accept, truncated to SNAP bytes, only segments from `peer` whose source port is
    `peer_port`, and of those:

    * with `port` (a source port the prober holds, no connection on it): every segment
      to `port`. A peer that still holds the 4-tuple in TIME_WAIT answers a SYN with a
      bare ACK, and the prober needs that ACK (see `probing.tcp_ttl`).
    * without: those that carry SYN or RST (what answers a probe). Without the flags
      test, a job's own connection to the same peer port filled the buffer with its ACKs
      (thousands a second on the emulated testbed), answers to probes were lost among
      them, and every re-verification dropped known ports.

    Everything else never reaches the socket's buffer."""
    head = [
        (_LD_W_ABS, 0, 0, 12),  # A = source address
        (_JEQ_K, 0, 6, int(ipaddress.IPv4Address(peer))),
        (_LDX_B_MSH, 0, 0, 0),  # X = IP header length
        (_LD_H_IND, 0, 0, 0),  # A = TCP source port
        (_JEQ_K, 0, 3, peer_port),
    ]
    test = [(_LD_H_IND, 0, 0, 2), (_JEQ_K, 0, 1, port)] if port is not None else \
        [(_LD_B_IND, 0, 0, 13), (_JSET_K, 0, 1, _SYN_OR_RST)]  # A = TCP dest port / flags
    return head + test + [(_RET_K, 0, 0, SNAP), (_RET_K, 0, 0, 0)]


def attach_filter(sock: socket.socket, program: list[tuple[int, int, int, int]]) -> None:
    """SO_ATTACH_FILTER with `program` (struct sock_fprog over struct sock_filter[])."""
    raw = b"".join(struct.pack("HBBI", *ins) for ins in program)
    buf = ctypes.create_string_buffer(raw, len(raw))
    fprog = struct.pack("HL", len(program), ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)  # the kernel copies it
