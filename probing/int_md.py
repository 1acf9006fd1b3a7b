"""In-band Network Telemetry, INT-MD mode over UDP (P4.org INT dataplane spec v2.1,
2020-11-11): bytes-level build / transit-push / parse with `struct`.

Wire layout of a crux probe's UDP payload (every field big-endian):

    INT shim for TCP/UDP          4 B   spec §5.7.2 "INT over TCP/UDP"
    INT-MD metadata header       12 B   spec §5.8 "INT-MD Metadata Header Format"
    metadata stack       n * HopML*4 B  newest hop first (§5.8: each node prepends)
    crux trailer                 16 B   8 B marker (probe or echo) + 8 B nonce

    shim      byte 0: Type (4 b) | NPT (2 b) | 2 reserved; byte 1: Length, in 4-byte words
              of INT-MD header + stack (the shim itself not counted since v2.0);
              bytes 2-3: NPT=0 reserved + original DSCP (bits 0-5), NPT=1 original UDP
              dport, NPT=2 original IP protocol
    INT-MD    byte 0: Ver (4 b) | D | E | M | 1 reserved; byte 1: reserved;
              byte 2: 3 reserved | Hop ML (5 b); byte 3: Remaining Hop Count;
              Instruction Bitmap (16 b), Domain Specific ID, DS Instruction, DS Flags
    hop       the bitmap's fields in bit order (§5.8: "in the order of bits set"):
              node id (32 b), ingress + egress interface ids (16 b each), hop latency (32 b)

The nonce lives in the trailer, i.e. where the spec puts the original UDP payload
(after the INT stack, which the shim's Length lets any device skip): transit nodes
never touch it, and it needs no Domain Specific ID that a transit node not knowing
the domain might answer by skipping INT altogether (§5.8, Domain Specific ID).
scapy 2.8 ships no INT layer; tests/int_scapy.py is an independent scapy decoder the
tests check this one against.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from transport.roce import tos

# §5.1 "INT Header Types": the shim's Type; §5.8: INT-MD header "Ver: Should be 2"
INT_TYPE_MD = 1
INT_VERSION = 2
# Instruction Bitmap (§5.8): bit0 is the MSB; each of these asks for 4 bytes per hop
NODE_ID = 0x8000  # bit0: Node ID
INTERFACES = 0x4000  # bit1: level-1 ingress interface id (16 b) + egress interface id (16 b)
HOP_LATENCY = 0x2000  # bit2: hop latency
SUPPORTED = NODE_ID | INTERFACES | HOP_LATENCY

SHIM_LEN = 4
MD_LEN = 12
TRAILER_LEN = 16
MAX_WORDS = 0xFF  # the shim's 8-bit Length, in 4-byte words, excluding the shim itself
# the largest valid probe or echo; one byte more in a receive buffer shows a bigger one
MAX_PAYLOAD = SHIM_LEN + MAX_WORDS * 4 + TRAILER_LEN
PROBE_MARK = b"crux-prb"
ECHO_MARK = b"crux-ech"

_HEAD = SHIM_LEN + MD_LEN
# shim + INT-MD header: Type|NPT|R, Length, NPT data, Ver|D|E|M|R, R, R|Hop ML,
# Remaining Hop Count, Instruction Bitmap, Domain Specific ID, DS Instruction, DS Flags
_HEADER = struct.Struct("!BBHBBBBHHHH")
_TRAILER = struct.Struct("!8sQ")  # marker, nonce
_E, _M = 0x04, 0x02  # in the INT-MD header's first byte
# one hop's record for each bitmap we decode (all have the node id)
_RECORD = {bits: struct.Struct("!I" + "HH" * bool(bits & INTERFACES)
                               + "I" * bool(bits & HOP_LATENCY))
           for bits in (NODE_ID, NODE_ID | INTERFACES, NODE_ID | HOP_LATENCY, SUPPORTED)}


def hop_words(instructions: int) -> int:
    """Per-hop metadata length (Hop ML, 4-byte words) for a bitmap of SUPPORTED bits."""
    return (instructions & SUPPORTED).bit_count()


@dataclass(frozen=True, slots=True)
class HopRecord:
    node_id: int
    ingress_if: int | None = None  # None: not asked for by the bitmap
    egress_if: int | None = None
    hop_latency: int | None = None


@dataclass(frozen=True, slots=True)
class IntReport:
    records: tuple[HopRecord, ...]  # path order: the hop nearest the source first
    exceeded: bool  # E: a node found Remaining Hop Count 0 and could not push
    mtu_exceeded: bool  # M: a node skipped pushing for its egress MTU
    remaining_hops: int
    instructions: int
    nonce: int
    echo: bool  # a responder's echo (True) or a source's probe (False)

    @property
    def hops(self) -> tuple[int, ...]:
        return tuple(r.node_id for r in self.records)


def build_probe(*, max_hops: int, instructions: int = NODE_ID, nonce: int, dscp: int = 0,
                orig_dport: int | None = None) -> bytes:
    """A source's UDP payload: shim + INT-MD header with an empty stack + trailer.
    `orig_dport` marks INT by UDP port (NPT=1, §5.7.2 option 1); otherwise NPT=0 and
    the network is expected to flag INT by DSCP, `dscp` being the original value.
    The source pushes no metadata of its own (optional, §5.3): a host is not a hop."""
    if not instructions & NODE_ID or instructions & ~SUPPORTED:
        raise ValueError(f"instructions {instructions:#06x}: need node id, only bits 0-2")
    if not 0 <= max_hops <= 0xFF or 3 + max_hops * hop_words(instructions) > MAX_WORDS:
        raise ValueError(f"max_hops {max_hops}: the shim's Length could not hold the stack")
    if not 0 <= nonce < 1 << 64 or not 0 <= dscp < 64:
        raise ValueError("nonce is 64 bits, dscp 6")
    if orig_dport is None:
        npt, npt_data = 0, tos(dscp)
    elif 0 <= orig_dport <= 0xFFFF:
        npt, npt_data = 1, orig_dport
    else:
        raise ValueError(f"orig_dport {orig_dport}")
    return _HEADER.pack(INT_TYPE_MD << 4 | npt << 2, MD_LEN // 4, npt_data, INT_VERSION << 4,
                        0, hop_words(instructions), max_hops, instructions, 0, 0, 0
                        ) + _TRAILER.pack(PROBE_MARK, nonce)


def _stack(payload: bytes) -> tuple[int, int] | None:
    """(bitmap, stack end) if the INT headers are consistent and the whole stack is there
    (the trailer is not looked at), else None. Reserved bits are ignored on reception."""
    if len(payload) < _HEAD:
        return None
    first, length, _, ver, _, hop_ml, _, bitmap, _, _, _ = _HEADER.unpack_from(payload)
    end = SHIM_LEN + length * 4  # Length counts the INT-MD header and the stack
    if first >> 4 != INT_TYPE_MD or (first >> 2) & 3 == 3 or ver >> 4 != INT_VERSION:
        return None  # NPT 3 is undefined (§5.7.2)
    words = hop_words(bitmap)
    if not bitmap & NODE_ID or bitmap & ~SUPPORTED or hop_ml & 0x1F != words:
        return None
    if end < _HEAD or (end - _HEAD) % (4 * words) or end > len(payload):
        return None  # Length below the INT-MD header, a partial record, a truncated stack
    return bitmap, end


def parse(payload: bytes) -> IntReport | None:
    """A probe or echo as it arrives, or None for anything else: truncated, trailing
    bytes, lengths that do not add up, unknown type or version, a bitmap without node
    id or with bits we do not decode, Hop ML not matching the bitmap. Never raises."""
    got = _stack(payload)
    if got is None or len(payload) != got[1] + TRAILER_LEN:
        return None
    bitmap, end = got
    mark, nonce = _TRAILER.unpack_from(payload, end)
    if mark not in (PROBE_MARK, ECHO_MARK):
        return None
    fields = _RECORD[bitmap].iter_unpack(payload[_HEAD:end])
    if bitmap == NODE_ID | HOP_LATENCY:  # the only layout with a gap in HopRecord's order
        records = [HopRecord(node, None, None, latency) for node, latency in fields]
    else:
        records = [HopRecord(*f) for f in fields]
    records.reverse()  # the stack is newest first; callers want path order
    flags = payload[SHIM_LEN]
    return IntReport(tuple(records), bool(flags & _E), bool(flags & _M),
                     payload[SHIM_LEN + 3], bitmap, nonce, mark == ECHO_MARK)


def push_hop(payload: bytes, node_id: int, *, ingress_if: int = 0, egress_if: int = 0,
             hop_latency: int = 0) -> bytes:
    """What an INT transit node does to a packet (§5.2.2, §5.8): prepend its metadata,
    decrement Remaining Hop Count, grow the shim's Length; at Remaining Hop Count 0 it
    sets E and pushes nothing, and if the Length field cannot grow it skips INT
    without decrementing. Bytes after the INT stack are left as they are.
    ValueError unless `payload` starts with INT data this module can decode."""
    if not (0 <= node_id < 1 << 32 and 0 <= hop_latency < 1 << 32
            and 0 <= ingress_if <= 0xFFFF and 0 <= egress_if <= 0xFFFF):
        raise ValueError("node id and hop latency are 32 bits, interface ids 16")
    got = _stack(payload)
    if got is None:
        raise ValueError("not an INT-MD payload")
    bitmap = got[0]
    head = bytearray(payload[:_HEAD])
    words = hop_words(bitmap)
    if head[SHIM_LEN + 3] == 0:
        head[SHIM_LEN] |= _E
        record = b""
    elif head[1] + words <= MAX_WORDS:
        head[1] += words
        head[SHIM_LEN + 3] -= 1
        values = [node_id]
        if bitmap & INTERFACES:
            values += (ingress_if, egress_if)
        if bitmap & HOP_LATENCY:
            values.append(hop_latency)
        record = _RECORD[bitmap].pack(*values)
    else:
        return bytes(payload)
    return bytes(head) + record + payload[_HEAD:]


def echo_of(probe: bytes) -> bytes:
    """A responder's answer: the probe unchanged but for the trailer's marker, so the
    echo is never larger than the probe and is never itself answered."""
    report = parse(probe)
    if report is None or report.echo:
        raise ValueError("not a probe")
    end = len(probe) - TRAILER_LEN
    return probe[:end] + ECHO_MARK + probe[end + len(ECHO_MARK):]
