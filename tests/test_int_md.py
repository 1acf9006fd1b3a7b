"""INT-MD over UDP (spec v2.1): golden bytes written out from the spec's field tables
(§5.7.2 shim, §5.8 INT-MD header), the transit push, and the defensive parser; and the
struct codec against an independent scapy decoder (tests/int_scapy.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from probing.int_md import (
    HOP_LATENCY,
    INTERFACES,
    MAX_WORDS,
    NODE_ID,
    build_probe,
    echo_of,
    hop_words,
    parse,
    push_hop,
)
from tests import int_scapy
from tests.int_scapy import IntMd, IntShim

NONCE = bytes.fromhex("0102030405060708")
PROBE_TRAILER = b"crux-prb" + NONCE  # crux's trailer: marker, then the 64-bit nonce
ECHO_TRAILER = b"crux-ech" + NONCE


def h(*words: str) -> bytes:
    return bytes.fromhex("".join(words))


# An empty-stack probe, max 8 hops, node id only, NPT=0 (INT flagged by DSCP), DSCP 0
EMPTY = h(
    "10",  # shim: Type=1 (INT-MD) | NPT=0 | R R
    "03",  # shim Length: 12 B INT-MD header = 3 words (the shim itself not counted)
    "0000",  # NPT=0: reserved byte, original DSCP 0 in bits 0-5 of the 2nd byte
    "20",  # Ver=2 | D=0 E=0 M=0 | 1st reserved bit
    "00",  # reserved
    "01",  # 3 reserved bits | Hop ML=1 (one 4-byte word: node id)
    "08",  # Remaining Hop Count = 8
    "8000",  # Instruction Bitmap: bit0 (MSB) = node id
    "0000",  # Domain Specific ID 0 (the default domain)
    "0000",  # DS Instruction
    "0000",  # DS Flags
) + PROBE_TRAILER

# after transit nodes 10, 11, 12 (in that order) pushed their node ids
THREE_HOPS = h(
    "10",
    "06",  # Length: 3 header words + 3 hops * Hop ML 1
    "0000",
    "20", "00", "01",
    "05",  # Remaining Hop Count 8 - 3
    "8000", "0000", "0000", "0000",
    "0000000c",  # node 12: the newest hop at the top of the stack
    "0000000b",  # node 11
    "0000000a",  # node 10: the first hop at the bottom
) + PROBE_TRAILER

# max 2 hops, three transit nodes: the third finds Remaining Hop Count 0
EXCEEDED = h(
    "10",
    "05",  # 3 + 2 hops
    "0000",
    "24",  # Ver=2 | D=0 E=1 M=0
    "00", "01",
    "00",  # Remaining Hop Count 0
    "8000", "0000", "0000", "0000",
    "0000000b",
    "0000000a",
) + PROBE_TRAILER

# all three instructions, NPT=1 (INT flagged by UDP port; original dport 4791 kept)
FULL = h(
    "14",  # Type=1 | NPT=1 | R R
    "06",  # 3 + 1 hop * Hop ML 3
    "12b7",  # NPT=1: original UDP destination port 4791
    "20",
    "00",
    "03",  # Hop ML 3: node id, ingress+egress interface ids, hop latency
    "01",  # 2 - 1
    "e000",  # bits 0, 1, 2
    "0000", "0000", "0000",
    "00000007",  # node id 7
    "0002",  # level-1 ingress interface id 2
    "0003",  # level-1 egress interface id 3
    "00000190",  # hop latency 400
) + PROBE_TRAILER


def test_golden_empty_probe() -> None:
    assert build_probe(max_hops=8, nonce=0x0102030405060708) == EMPTY
    r = parse(EMPTY)
    assert r is not None
    assert (r.hops, r.exceeded, r.mtu_exceeded, r.remaining_hops, r.nonce, r.echo) == (
        (), False, False, 8, 0x0102030405060708, False)


def test_golden_three_hops_in_path_order() -> None:
    p = build_probe(max_hops=8, nonce=0x0102030405060708)
    for node in (10, 11, 12):
        p = push_hop(p, node)
    assert p == THREE_HOPS
    r = parse(THREE_HOPS)
    assert r is not None and r.hops == (10, 11, 12) and r.remaining_hops == 5
    assert not r.exceeded


def test_golden_exhausted_hop_count_sets_e_and_pushes_nothing() -> None:
    p = build_probe(max_hops=2, nonce=0x0102030405060708)
    for node in (10, 11, 12):
        p = push_hop(p, node)
    assert p == EXCEEDED
    r = parse(EXCEEDED)
    assert r is not None and r.exceeded and r.hops == (10, 11) and r.remaining_hops == 0
    assert push_hop(EXCEEDED, 13) == EXCEEDED  # E already set, still nothing pushed


def test_golden_all_supported_instructions() -> None:
    p = build_probe(max_hops=2, instructions=NODE_ID | INTERFACES | HOP_LATENCY,
                    nonce=0x0102030405060708, orig_dport=4791)
    p = push_hop(p, 7, ingress_if=2, egress_if=3, hop_latency=400)
    assert p == FULL
    r = parse(FULL)
    assert r is not None and len(r.records) == 1
    rec = r.records[0]
    assert (rec.node_id, rec.ingress_if, rec.egress_if, rec.hop_latency) == (7, 2, 3, 400)


def test_spec_example_6_5_dissects_with_our_layers() -> None:
    """§6.5 "INT-MD in-between UDP header and UDP payload", as received by the sink:
    2 hops of node id + queue occupancy, max 8 hops, original port XYZ (here 0x1234)."""
    pkt = h("14", "07", "1234",  # Type=1 | NPT=1, Length=7, UDP port XYZ
            "20", "00", "02", "06",  # Ver=2, Hop ML=2, Remaining Hop Count 6
            "9000", "0000",  # bitmap 1001 0000 0000 0000: node id + queue occupancy
            "0000", "0000",
            "00000002", "0000aaaa",  # hop2: node id, queue occupancy
            "00000001", "0000bbbb",  # hop1
            ) + b"udp payload"
    shim = IntShim(pkt)
    md = shim.payload
    assert (shim.type, shim.npt, shim.length, shim.npt_data) == (1, 1, 7, 0x1234)
    assert isinstance(md, IntMd)
    assert (md.ver, md.e, md.hop_ml, md.remaining_hops, md.instructions) == (2, 0, 2, 6, 0x9000)
    assert bytes(md.payload) == b"udp payload"
    assert parse(pkt) is None  # queue occupancy is not decoded here, and no crux trailer


def test_echo_is_the_probe_with_another_marker() -> None:
    echo = echo_of(THREE_HOPS)
    assert echo == THREE_HOPS[:-16] + ECHO_TRAILER and len(echo) == len(THREE_HOPS)
    r = parse(echo)
    assert r is not None and r.echo and r.hops == (10, 11, 12)
    with pytest.raises(ValueError):
        echo_of(echo)  # an echo is never answered
    with pytest.raises(ValueError):
        echo_of(b"junk")


def test_reserved_bits_are_ignored_on_reception() -> None:
    p = bytearray(THREE_HOPS)
    p[0] |= 0x03  # shim R R
    p[4] |= 0x01  # INT-MD reserved, 1st bit
    p[5] = 0xFF
    p[6] |= 0xE0  # the 3 reserved bits before Hop ML
    r = parse(bytes(p))
    assert r is not None and r.hops == (10, 11, 12)
    mtu = bytearray(THREE_HOPS)
    mtu[4] |= 0x02  # M
    r = parse(bytes(mtu))
    assert r is not None and r.mtu_exceeded and not r.exceeded


def _set(base: bytes, at: int, value: int) -> bytes:
    b = bytearray(base)
    b[at] = value
    return bytes(b)


@pytest.mark.parametrize("bad", [
    _set(THREE_HOPS, 0, 0x20),  # Type 2 (destination-type header)
    _set(THREE_HOPS, 0, 0x1C),  # NPT 3, undefined
    _set(THREE_HOPS, 4, 0x10),  # Ver 1
    _set(THREE_HOPS, 6, 0x02),  # Hop ML 2 for a 1-word bitmap
    _set(THREE_HOPS, 8, 0x00),  # bitmap without node id
    _set(THREE_HOPS, 8, 0x90),  # queue occupancy: a bit we do not decode
    _set(THREE_HOPS, 1, 0x07),  # Length past the stack
    _set(THREE_HOPS, 1, 0x05),  # Length short of the stack
    _set(THREE_HOPS, 1, 0x02),  # Length below the INT-MD header
    THREE_HOPS + b"\0",  # trailing bytes
    THREE_HOPS[:-1],  # truncated
    THREE_HOPS[:-16],  # no trailer
    THREE_HOPS[:-16] + b"crux-xxx" + NONCE,  # unknown marker
    b"",
])
def test_inconsistent_packets_are_rejected(bad: bytes) -> None:
    assert parse(bad) is None


def test_build_and_push_refuse_what_they_cannot_encode() -> None:
    with pytest.raises(ValueError):
        build_probe(max_hops=8, instructions=INTERFACES, nonce=1)  # no node id
    with pytest.raises(ValueError):
        build_probe(max_hops=8, instructions=NODE_ID | 0x1000, nonce=1)
    with pytest.raises(ValueError):
        build_probe(max_hops=253, nonce=1)  # 3 + 253 words > the 8-bit Length
    with pytest.raises(ValueError):
        build_probe(max_hops=8, nonce=1 << 64)
    with pytest.raises(ValueError):
        push_hop(b"not int", 1)
    with pytest.raises(ValueError):
        push_hop(EMPTY, 1 << 32)


def test_a_full_length_field_means_no_push_and_no_decrement() -> None:
    p = build_probe(max_hops=252, nonce=1)
    for node in range(252):
        p = push_hop(p, node)
    assert p[1] == 255 and parse(p) is not None
    full = _set(p, 7, 1)  # pretend a hop is still allowed: the Length cannot grow past 255
    assert push_hop(full, 999) == full


@given(st.binary(max_size=300))
def test_any_bytes_never_raise(data: bytes) -> None:
    r = parse(data)
    assert r is None or len(data) - 32 == 4 * hop_words(r.instructions) * len(r.records)
    assert r == int_scapy.decode(data)


_INSTR = st.sampled_from([NODE_ID, NODE_ID | INTERFACES, NODE_ID | HOP_LATENCY,
                          NODE_ID | INTERFACES | HOP_LATENCY])


@given(st.lists(st.integers(0, 2**32 - 1), max_size=8), _INSTR, st.integers(0, 8),
       st.integers(0, 2**64 - 1))
def test_round_trip_of_stacks(nodes: list[int], instructions: int, spare: int,
                              nonce: int) -> None:
    max_hops = len(nodes) + spare
    p = build_probe(max_hops=max_hops, instructions=instructions, nonce=nonce)
    for i, node in enumerate(nodes):
        p = push_hop(p, node, ingress_if=i, egress_if=i + 1, hop_latency=node ^ 1)
    r = parse(p)
    assert r is not None
    assert r.hops == tuple(nodes) and r.nonce == nonce and not r.exceeded and not r.echo
    assert r.remaining_hops == spare and r.instructions == instructions
    if instructions & INTERFACES:
        assert [x.ingress_if for x in r.records] == list(range(len(nodes)))
    assert p[-16:-8] == b"crux-prb"
    if spare == 0:
        r = parse(push_hop(p, 1))
        assert r is not None and r.exceeded and r.hops == tuple(nodes)


@given(st.lists(st.integers(0, 2**32 - 1), max_size=8), st.data())
def test_truncated_or_mutated_packets(nodes: list[int], data: st.DataObject) -> None:
    p = build_probe(max_hops=8, instructions=NODE_ID | INTERFACES, nonce=5)
    for node in nodes:
        p = push_hop(p, node)
    cut = data.draw(st.integers(0, len(p) - 1))
    assert parse(p[:cut]) is None  # a truncated packet never yields hops
    at = data.draw(st.integers(0, len(p) - 1))
    mutated = _set(p, at, data.draw(st.integers(0, 255)))
    r = parse(mutated)
    if r is not None:  # a changed byte may still be consistent, but never resizes the stack
        assert len(r.records) == len(nodes)
    extra = data.draw(st.binary(min_size=1, max_size=16))
    assert parse(p + extra) is None


# the scapy oracle (tests/int_scapy.py): probes built by scapy's field tables, and the
# scapy-based parse and push the struct codec replaced

_HOP = st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 0xFFFF), st.integers(0, 0xFFFF),
                 st.integers(0, 2**32 - 1))


@st.composite
def _probes(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A probe from build_probe + push_hop, and the same one from scapy's layers."""
    instructions = draw(_INSTR)
    max_hops = draw(st.integers(0, (MAX_WORDS - 3) // hop_words(instructions)))
    nonce = draw(st.integers(0, 2**64 - 1))
    hops = draw(st.lists(_HOP, max_size=min(max_hops, 12) + 2))  # beyond max_hops: E
    if draw(st.booleans()):
        dport = draw(st.integers(0, 0xFFFF))
        p = build_probe(max_hops=max_hops, instructions=instructions, nonce=nonce,
                        orig_dport=dport)
        npt, npt_data = 1, dport
    else:
        dscp = draw(st.integers(0, 63))
        p = build_probe(max_hops=max_hops, instructions=instructions, nonce=nonce, dscp=dscp)
        npt, npt_data = 0, dscp << 2
    for node, ingress, egress, latency in hops:
        p = push_hop(p, node, ingress_if=ingress, egress_if=egress, hop_latency=latency)
    oracle = int_scapy.probe(npt=npt, npt_data=npt_data, max_hops=max_hops,
                             instructions=instructions, nonce=nonce, hops=hops)
    return p, oracle


@given(_probes())
def test_codec_matches_the_scapy_oracle(probes: tuple[bytes, bytes]) -> None:
    p, oracle = probes
    assert p == oracle
    r = parse(p)
    assert r is not None and r == int_scapy.decode(p)
    echo = echo_of(p)
    assert parse(echo) == int_scapy.decode(echo) and parse(echo).echo  # type: ignore[union-attr]


@given(_probes(), st.data())
def test_codec_matches_the_scapy_oracle_on_damaged_packets(probes: tuple[bytes, bytes],
                                                          data: st.DataObject) -> None:
    p = probes[0]
    how = data.draw(st.sampled_from(["set", "flip", "cut", "append"]))
    if how == "set":
        at = data.draw(st.integers(0, len(p) - 1))
        p = _set(p, at, data.draw(st.integers(0, 255)))
    elif how == "flip":  # one bit of the shim or INT-MD header: mostly still INT
        at, bit = data.draw(st.integers(0, 15)), data.draw(st.integers(0, 7))
        p = _set(p, at, p[at] ^ 1 << bit)
    elif how == "cut":
        p = p[:data.draw(st.integers(0, len(p) - 1))]
    else:
        p += data.draw(st.binary(min_size=1, max_size=24))
    assert parse(p) == int_scapy.decode(p)
    hop = data.draw(_HOP)
    try:
        pushed: bytes | None = push_hop(p, hop[0], ingress_if=hop[1], egress_if=hop[2],
                                        hop_latency=hop[3])
    except ValueError:
        pushed = None
    assert pushed == int_scapy.push(p, *hop)  # bytes after the stack kept, as scapy kept them


def test_codec_matches_the_scapy_oracle_at_a_full_length_field() -> None:
    p = build_probe(max_hops=84, instructions=NODE_ID | INTERFACES | HOP_LATENCY, nonce=3)
    for node in range(84):
        p = push_hop(p, node, ingress_if=1, egress_if=2, hop_latency=3)
    full = _set(p, 7, 9)  # Length 255: no room for another 3-word record
    assert push_hop(full, 1) == int_scapy.push(full, 1) == full
    assert parse(full) == int_scapy.decode(full)
