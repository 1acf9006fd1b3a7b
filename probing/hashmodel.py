"""ECMP hash models: which next hop a switch picks for a 5-tuple, when its hash is known.

A sweep that cannot see the hash needs ~N*H_N probes to find N paths (probing/budget.py);
one that knows it computes one source port per path and needs N. A model is the
switch's configuration as a value: the hash function, its seed, the 5-tuple fields it
hashes (ASICs make this selectable), and how the hash becomes a next-hop index.

Functions:
  "crc32"        IEEE 802.3, reflected (zlib.crc32); the seed is the initial value.
  "crc16-ccitt"  polynomial 0x1021, not reflected (binascii.crc_hqx); seed 0xFFFF gives
                 CRC-16/CCITT-FALSE, 0 gives XMODEM. Both CRCs are switch-style: the
                 selected fields packed back to back in network byte order (IPs 4 bytes,
                 proto 1, ports 2).
  "jhash"        the Linux kernel's jhash() (include/linux/jhash.h, Bob Jenkins' lookup3
                 with JHASH_INITVAL, little-endian word loads) over the key exactly as
                 nftables' `jhash` expression sees it (net/netfilter/nft_hash.c): a
                 concatenation of fields is hashed as its source registers, each field
                 in its own zero-padded 32-bit register in packet (network) byte order
                 (a port is its 2 bytes, then 2 zero bytes); a single field is hashed at
                 its own length. The seed is jhash's initval.

Selection of one of n next hops from hash h of `width` bits:
  "modulo"       h % n (the usual switch ECMP group lookup)
  "reciprocal"   (h * n) >> width (the kernel's reciprocal_scale(), as nft's `mod n`)

Multi-tier: every tier hashes the same, unrewritten 5-tuple, so a path through k tiers
is the tuple of the k tiers' choices (`Tiers`). Switches of different tiers must use
different seeds or functions: with the same hash and selection, tier 2's choice is a
function of tier 1's (polarisation) and only n of the n*m paths ever carry traffic.
Linux's own multipath hash (siphash over flow keys, `fib_multipath_hash_seed`, 6.11+)
is not modelled: it hashes a kernel struct layout that was not verified on the rig.
"""

from __future__ import annotations

import binascii
import ipaddress
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from transport.roce import ROCE_DPORT, ROCE_SPORTS

UDP = 17
JHASH_INITVAL = 0xDEADBEEF
_M32 = 0xFFFFFFFF

FIELDS = ("src", "dst", "proto", "sport", "dport")
_SIZE = {"src": 4, "dst": 4, "proto": 1, "sport": 2, "dport": 2}
FUNCTIONS = {"crc32": 32, "crc16-ccitt": 16, "jhash": 32}  # name -> hash width in bits
SELECTS = ("modulo", "reciprocal")


# --- the hash functions ---------------------------------------------------------------

def crc32(data: bytes, seed: int = 0) -> int:
    return zlib.crc32(data, seed) & _M32


def crc16_ccitt(data: bytes, seed: int = 0xFFFF) -> int:
    # binascii.crc_hqx is exactly this CRC (poly 0x1021, MSB first, no final xor), in C
    return binascii.crc_hqx(data, seed & 0xFFFF)


def _rol(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _M32


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    """__jhash_mix; every step is mod 2**32 as on u32."""
    a = ((a - c) & _M32) ^ _rol(c, 4)
    c = (c + b) & _M32
    b = ((b - a) & _M32) ^ _rol(a, 6)
    a = (a + c) & _M32
    c = ((c - b) & _M32) ^ _rol(b, 8)
    b = (b + a) & _M32
    a = ((a - c) & _M32) ^ _rol(c, 16)
    c = (c + b) & _M32
    b = ((b - a) & _M32) ^ _rol(a, 19)
    a = (a + c) & _M32
    c = ((c - b) & _M32) ^ _rol(b, 4)
    b = (b + a) & _M32
    return a, b, c


def _final(a: int, b: int, c: int) -> int:
    """__jhash_final; only c is returned."""
    c = ((c ^ b) - _rol(b, 14)) & _M32
    a = ((a ^ c) - _rol(c, 11)) & _M32
    b = ((b ^ a) - _rol(a, 25)) & _M32
    c = ((c ^ b) - _rol(b, 16)) & _M32
    a = ((a ^ c) - _rol(c, 4)) & _M32
    b = ((b ^ a) - _rol(a, 14)) & _M32
    c = ((c ^ b) - _rol(b, 24)) & _M32
    return c


def jhash(key: bytes, initval: int = 0) -> int:
    """The kernel's jhash(key, len(key), initval) on a little-endian CPU."""
    length = len(key)
    a = b = c = (JHASH_INITVAL + length + initval) & _M32
    k = 0
    while length > 12:  # all but the last block (a full last block goes to the tail)
        a = (a + int.from_bytes(key[k:k + 4], "little")) & _M32
        b = (b + int.from_bytes(key[k + 4:k + 8], "little")) & _M32
        c = (c + int.from_bytes(key[k + 8:k + 12], "little")) & _M32
        a, b, c = _mix(a, b, c)
        length -= 12
        k += 12
    if length == 0:  # `case 0`: no final mixing
        return c
    # the tail switch adds k[i] << 8*(i%4) to a, b, c: a little-endian load of the
    # zero-padded tail
    tail = key[k:].ljust(12, b"\0")
    a = (a + int.from_bytes(tail[0:4], "little")) & _M32
    b = (b + int.from_bytes(tail[4:8], "little")) & _M32
    c = (c + int.from_bytes(tail[8:12], "little")) & _M32
    return _final(a, b, c)


def reciprocal_scale(h: int, n: int, width: int = 32) -> int:
    return (h * n) >> width


# --- the model ------------------------------------------------------------------------

def _ip(addr: str | int) -> int:
    return addr if isinstance(addr, int) else int(ipaddress.IPv4Address(addr))


@dataclass(frozen=True)
class HashModel:
    """One switch tier's ECMP hash. The number of next hops, n, is the topology's and is
    passed per call, so one model serves every ECMP group of the tier."""

    function: str = "jhash"
    seed: int = 0
    fields: tuple[str, ...] = ("src", "dst", "sport", "dport")  # in the hashed order
    select: str = "reciprocal"

    def __post_init__(self) -> None:
        if self.function not in FUNCTIONS:
            raise ValueError(f"function must be one of {sorted(FUNCTIONS)}")
        if self.select not in SELECTS:
            raise ValueError(f"select must be one of {SELECTS}")
        if not self.fields or any(f not in FIELDS for f in self.fields):
            raise ValueError(f"fields: a non-empty selection of {FIELDS}")
        if len(set(self.fields)) != len(self.fields):
            raise ValueError("fields: each at most once")
        if not 0 <= self.seed <= _M32:
            raise ValueError("seed must fit in 32 bits")

    @property
    def width(self) -> int:
        return FUNCTIONS[self.function]

    def key(self, src: str | int, dst: str | int, sport: int, dport: int = ROCE_DPORT,
            proto: int = UDP) -> bytes:
        """The bytes hashed: switch-style packed fields, or nft's 32-bit registers."""
        values = {"src": _ip(src), "dst": _ip(dst), "proto": proto, "sport": sport,
                  "dport": dport}
        if self.function == "jhash" and len(self.fields) > 1:
            # a concatenation: each field in its own zero-padded 32-bit register
            return b"".join(values[f].to_bytes(_SIZE[f], "big").ljust(4, b"\0")
                            for f in self.fields)
        # a single field is hashed at its own length (nft: jhash(reg, 2) for a port)
        return b"".join(values[f].to_bytes(_SIZE[f], "big") for f in self.fields)

    def hash(self, src: str | int, dst: str | int, sport: int, dport: int = ROCE_DPORT,
             proto: int = UDP) -> int:
        data = self.key(src, dst, sport, dport, proto)
        if self.function == "jhash":
            return jhash(data, self.seed)
        if self.function == "crc32":
            return crc32(data, self.seed)
        return crc16_ccitt(data, self.seed)

    def index(self, h: int, n: int) -> int:
        """Which of n next hops hash value h picks."""
        if n < 1:
            raise ValueError("n must be >= 1")
        return h % n if self.select == "modulo" else reciprocal_scale(h, n, self.width)

    def path_of(self, src: str | int, dst: str | int, sport: int, dport: int = ROCE_DPORT,
                proto: int = UDP, *, n: int) -> int:
        """The next hop (0..n-1) this tier picks for the 5-tuple."""
        return self.index(self.hash(src, dst, sport, dport, proto), n)

    def ports_per_path(self, src: str | int, dst: str | int, n: int,
                       sports: Iterable[int] = ROCE_SPORTS,
                       dport: int = ROCE_DPORT) -> dict[int, int]:
        """One source port per next hop: the first of `sports` that maps there. Stops once
        all n are covered; a missing index means no port in `sports` reaches it."""
        s, d = _ip(src), _ip(dst)
        out: dict[int, int] = {}
        for sport in sports:
            out.setdefault(self.path_of(s, d, sport, dport, n=n), sport)
            if len(out) == n:
                break
        return dict(sorted(out.items()))


@dataclass(frozen=True)
class Tiers:
    """Consecutive ECMP tiers on the way to a peer (e.g. leaf uplink, then spine uplink in
    a 3-tier fabric): `tiers` pairs each tier's model with its fan-out. Path indices are
    mixed-radix, the first tier most significant: index = ((i0 * n1) + i1) * n2 + i2 ..."""

    tiers: tuple[tuple[HashModel, int], ...]

    @property
    def n(self) -> int:
        total = 1
        for _, fanout in self.tiers:
            total *= fanout
        return total

    def choices(self, src: str | int, dst: str | int, sport: int, dport: int = ROCE_DPORT,
                proto: int = UDP) -> tuple[int, ...]:
        return tuple(m.path_of(src, dst, sport, dport, proto, n=fanout)
                     for m, fanout in self.tiers)

    def path_of(self, src: str | int, dst: str | int, sport: int, dport: int = ROCE_DPORT,
                proto: int = UDP) -> int:
        index = 0
        for (_, fanout), i in zip(self.tiers, self.choices(src, dst, sport, dport, proto),
                                  strict=True):
            index = index * fanout + i
        return index

    def ports_per_path(self, src: str | int, dst: str | int, n: int,
                       sports: Iterable[int] = ROCE_SPORTS,
                       dport: int = ROCE_DPORT) -> dict[int, int]:
        """As HashModel.ports_per_path; n must be the product of the fan-outs. A polarised
        configuration leaves indices out however many ports are tried."""
        if n != self.n:
            raise ValueError(f"n={n}, but the tiers have {self.n} paths")
        s, d = _ip(src), _ip(dst)
        out: dict[int, int] = {}
        for sport in sports:
            out.setdefault(self.path_of(s, d, sport, dport), sport)
            if len(out) == n:
                break
        return dict(sorted(out.items()))

