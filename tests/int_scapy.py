"""A reference INT-MD decoder and encoder in scapy, for tests only: probing/int_md.py is
plain `struct`, and tests/test_int_md.py checks it against these layers, written
independently as scapy field tables (P4.org INT spec v2.1, §5.7.2 shim, §5.8 INT-MD
header). scapy is a dev dependency: nothing at run time may import this module.

`decode` and `push` are what probing/int_md.py's `parse` and `push_hop` did when they
were built on these layers, kept as the oracle for the rewrite.
"""

from __future__ import annotations

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

from probing.int_md import (
    ECHO_MARK,
    HOP_LATENCY,
    INT_TYPE_MD,
    INT_VERSION,
    INTERFACES,
    MAX_WORDS,
    MD_LEN,
    NODE_ID,
    PROBE_MARK,
    SHIM_LEN,
    SUPPORTED,
    TRAILER_LEN,
    HopRecord,
    IntReport,
)


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
            words = bin(int(self.instructions) & SUPPORTED).count("1")
            pkt = pkt[:2] + bytes([(pkt[2] & 0xE0) | words]) + pkt[3:]
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


def _dissect(payload: bytes) -> tuple[IntShim, IntMd] | None:
    """The INT part if its headers are consistent (not the trailer), else None."""
    if len(payload) < SHIM_LEN + MD_LEN:
        return None
    try:
        shim = IntShim(payload)
    except Exception:  # scapy's dissectors raise on some inputs; the codec must not
        return None
    md = shim.payload
    if shim.type != INT_TYPE_MD or shim.npt == 3 or not isinstance(md, IntMd):
        return None
    bitmap = int(md.instructions)
    rec = bin(bitmap & SUPPORTED).count("1") * 4
    if md.ver != INT_VERSION or not bitmap & NODE_ID or bitmap & ~SUPPORTED:
        return None
    stack = shim.length * 4 - MD_LEN
    if (md.hop_ml * 4 != rec or stack < 0 or stack % rec
            or SHIM_LEN + MD_LEN + stack > len(payload)):
        return None
    if len(md.hops) != stack // rec or not all(isinstance(h, IntHop) for h in md.hops):
        return None
    return shim, md


def decode(payload: bytes) -> IntReport | None:
    """What int_md.parse must return for `payload`."""
    got = _dissect(payload)
    if got is None:
        return None
    shim, md = got
    if len(payload) != SHIM_LEN + shim.length * 4 + TRAILER_LEN:
        return None
    trailer = md.payload  # exactly 16 bytes here: a CruxTrailer if the marker is known
    if not isinstance(trailer, CruxTrailer):
        return None
    bitmap = int(md.instructions)
    records = tuple(HopRecord(
        int(h.node_id),
        int(h.ingress_if) if bitmap & INTERFACES else None,
        int(h.egress_if) if bitmap & INTERFACES else None,
        int(h.hop_latency) if bitmap & HOP_LATENCY else None,
    ) for h in reversed(md.hops))  # the stack is newest first; reports are in path order
    return IntReport(records, bool(md.e), bool(md.m), int(md.remaining_hops), bitmap,
                     int(trailer.nonce), trailer.mark == ECHO_MARK)


def push(payload: bytes, node_id: int, ingress_if: int = 0, egress_if: int = 0,
         hop_latency: int = 0) -> bytes | None:
    """What int_md.push_hop must return for in-range arguments; None for its ValueError."""
    got = _dissect(payload)
    if got is None:
        return None
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


def probe(*, npt: int, npt_data: int, max_hops: int, instructions: int, nonce: int,
          hops: list[tuple[int, int, int, int]], mark: bytes = PROBE_MARK) -> bytes:
    """A probe built by scapy after transit nodes pushed `hops` (node id, ingress,
    egress, latency; in path order): at most max_hops pushed, E set for any beyond."""
    pushed = hops[:max_hops]
    md = IntMd(remaining_hops=max_hops - len(pushed), instructions=instructions,
               e=int(len(hops) > max_hops),
               hops=[IntHop(node_id=n, ingress_if=i, egress_if=o, hop_latency=lat)
                     for n, i, o, lat in reversed(pushed)])
    return bytes(IntShim(npt=npt, npt_data=npt_data) / md / CruxTrailer(mark=mark, nonce=nonce))
