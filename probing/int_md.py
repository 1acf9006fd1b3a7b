"""In-band Network Telemetry, INT-MD mode over UDP (P4.org INT dataplane spec v2.1,
2020-11-11): the layers as scapy packets, and bytes-level build / transit-push / parse.

scapy 2.8 ships no INT layer (only contrib.roce), so the three headers are defined
here. Wire layout of a crux probe's UDP payload (every field big-endian):

    INT shim for TCP/UDP          4 B   spec §5.7.2 "INT over TCP/UDP"
    INT-MD metadata header       12 B   spec §5.8 "INT-MD Metadata Header Format"
    metadata stack       n * HopML*4 B  newest hop first (§5.8: each node prepends)
    crux trailer                 16 B   8 B marker (probe or echo) + 8 B nonce

The nonce lives in the trailer, i.e. where the spec puts the original UDP payload
(after the INT stack, which the shim's Length lets any device skip): transit nodes
never touch it, and it needs no Domain Specific ID that a transit node not knowing
the domain might answer by skipping INT altogether (§5.8, Domain Specific ID).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

from scapy.fields import (
    AnyField,
    BitField,
    ByteField,
    ConditionalField,
    IntField,
    PacketListField,
    ShortField,
    StrFixedLenField,
    XIntField,
    XLongField,
    XShortField,
)
from scapy.packet import Packet, Raw, bind_layers

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


def hop_words(instructions: int) -> int:
    """Per-hop metadata length (Hop ML, 4-byte words) for a bitmap of SUPPORTED bits."""
    return bin(instructions & SUPPORTED).count("1")


def _bitmap(hop: Packet) -> int:
    # a record's fields follow the enclosing INT-MD header's bitmap; alone, node id only
    parent = hop.parent
    return int(parent.instructions) if isinstance(parent, IntMd) else NODE_ID


class IntHop(Packet):
    """One node's metadata, fields in bitmap order (§5.8: "in the order of bits set")."""

    name = "INT-MD hop metadata"
    fields_desc: ClassVar[list[AnyField]] = [
        ConditionalField(XIntField("node_id", 0), lambda p: bool(_bitmap(p) & NODE_ID)),
        ConditionalField(ShortField("ingress_if", 0), lambda p: bool(_bitmap(p) & INTERFACES)),
        ConditionalField(ShortField("egress_if", 0), lambda p: bool(_bitmap(p) & INTERFACES)),
        ConditionalField(IntField("hop_latency", 0), lambda p: bool(_bitmap(p) & HOP_LATENCY)),
    ]

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes | None]:
        return b"", s  # the rest of the stack belongs to the next record


def _stack_len(md: Packet) -> int:
    # §5.8: stack length = shim Length * 4 - the 12-byte INT-MD header
    shim = md.underlayer
    return max(0, int(shim.length) * 4 - MD_LEN) if isinstance(shim, IntShim) else 0


class IntMd(Packet):
    """INT-MD metadata header (§5.8) and its metadata stack."""

    name = "INT-MD metadata header"
    fields_desc: ClassVar[list[AnyField]] = [
        BitField("ver", INT_VERSION, 4),
        BitField("d", 0, 1),  # Discard (at the sink)
        BitField("e", 0, 1),  # Max Hop Count exceeded
        BitField("m", 0, 1),  # MTU exceeded
        BitField("reserved", 0, 12),
        BitField("hop_ml", None, 5),  # None: from the bitmap, at build
        ByteField("remaining_hops", 8),
        XShortField("instructions", NODE_ID),
        XShortField("domain_id", 0),
        XShortField("ds_instructions", 0),
        XShortField("ds_flags", 0),
        # up to 252 one-word hops fit the Length field, more than scapy's default cap
        PacketListField("hops", [], IntHop, length_from=_stack_len, max_count=MAX_WORDS),
    ]

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.hop_ml is None:  # Hop ML is the low 5 bits of byte 2
            pkt = pkt[:2] + bytes([(pkt[2] & 0xE0) | hop_words(self.instructions)]) + pkt[3:]
        return pkt + pay

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return CruxTrailer if payload[:8] in (PROBE_MARK, ECHO_MARK) else Raw


class IntShim(Packet):
    """INT shim header for TCP/UDP (§5.7.2)."""

    name = "INT shim (TCP/UDP)"
    fields_desc: ClassVar[list[AnyField]] = [
        BitField("type", INT_TYPE_MD, 4),
        BitField("npt", 0, 2),  # 0: INT flagged by DSCP; 1: orig. UDP dport; 2: orig. IP proto
        BitField("reserved", 0, 2),
        ByteField("length", None),  # words of INT header + stack; shim excluded since v2.0
        # NPT=0: byte 1 bits 0-5 = original DSCP; NPT=1: original UDP dport; NPT=2: proto
        XShortField("npt_data", 0),
    ]

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.length is None:
            md = self.payload
            words = len(md.self_build()) // 4 if isinstance(md, IntMd) else 0
            pkt = pkt[:1] + bytes([words]) + pkt[2:]
        return pkt + pay


class CruxTrailer(Packet):
    """crux's own end-to-end data after the INT stack: direction marker and nonce."""

    name = "crux INT probe trailer"
    fields_desc: ClassVar[list[AnyField]] = [
        StrFixedLenField("mark", PROBE_MARK, 8),  # PROBE_MARK from a source, ECHO_MARK back
        XLongField("nonce", 0),
    ]


bind_layers(IntShim, IntMd, type=INT_TYPE_MD)


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
        shim = IntShim(npt=0, npt_data=tos(dscp))
    elif 0 <= orig_dport <= 0xFFFF:
        shim = IntShim(npt=1, npt_data=orig_dport)
    else:
        raise ValueError(f"orig_dport {orig_dport}")
    md = IntMd(remaining_hops=max_hops, instructions=instructions)
    return bytes(shim / md / CruxTrailer(mark=PROBE_MARK, nonce=nonce))


def _dissect(payload: bytes) -> tuple[IntShim, IntMd] | None:
    """The INT part if its headers are consistent (not the trailer), else None."""
    if len(payload) < SHIM_LEN + MD_LEN:
        return None
    try:
        shim = IntShim(payload)
    except Exception:  # scapy's dissectors are not ours to audit: no bytes may raise here
        return None
    md = shim.payload
    if shim.type != INT_TYPE_MD or shim.npt == 3 or not isinstance(md, IntMd):
        return None
    bitmap, rec = int(md.instructions), hop_words(md.instructions) * 4
    if md.ver != INT_VERSION or not bitmap & NODE_ID or bitmap & ~SUPPORTED:
        return None
    stack = shim.length * 4 - MD_LEN
    if (md.hop_ml * 4 != rec or stack < 0 or stack % rec
            or SHIM_LEN + MD_LEN + stack > len(payload)):
        return None
    if len(md.hops) != stack // rec or not all(isinstance(h, IntHop) for h in md.hops):
        return None
    return shim, md


def parse(payload: bytes) -> IntReport | None:
    """A probe or echo as it arrives, or None for anything else: truncated, trailing
    bytes, lengths that do not add up, unknown type or version, a bitmap without node
    id or with bits we do not decode, Hop ML not matching the bitmap. Never raises."""
    got = _dissect(payload)
    if got is None:
        return None
    shim, md = got
    if len(payload) != SHIM_LEN + shim.length * 4 + TRAILER_LEN:
        return None
    mark, nonce = struct.unpack_from("!8sQ", payload, len(payload) - TRAILER_LEN)
    if mark not in (PROBE_MARK, ECHO_MARK):
        return None
    bitmap = int(md.instructions)
    records = tuple(HopRecord(
        int(h.node_id),
        int(h.ingress_if) if bitmap & INTERFACES else None,
        int(h.egress_if) if bitmap & INTERFACES else None,
        int(h.hop_latency) if bitmap & HOP_LATENCY else None,
    ) for h in reversed(md.hops))  # the stack is newest first; callers want path order
    return IntReport(records, bool(md.e), bool(md.m), int(md.remaining_hops), bitmap, nonce,
                     mark == ECHO_MARK)


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
    got = _dissect(payload)
    if got is None:
        raise ValueError("not an INT-MD payload")
    shim, md = got
    if md.remaining_hops == 0:
        md.e = 1
    elif shim.length + md.hop_ml <= MAX_WORDS:
        hop = IntHop(node_id=node_id, ingress_if=ingress_if, egress_if=egress_if,
                     hop_latency=hop_latency)
        md.hops = [hop, *md.hops]  # reassigned, not mutated: scapy caches built bytes
        md.remaining_hops -= 1
        shim.length += md.hop_ml
    return bytes(shim)


def echo_of(probe: bytes) -> bytes:
    """A responder's answer: the probe unchanged but for the trailer's marker, so the
    echo is never larger than the probe and is never itself answered."""
    report = parse(probe)
    if report is None or report.echo:
        raise ValueError("not a probe")
    end = len(probe) - TRAILER_LEN
    return probe[:end] + ECHO_MARK + probe[end + len(ECHO_MARK):]
