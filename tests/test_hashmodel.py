"""ECMP hash models (probing/hashmodel.py) and the model-guided sweep (probing/guided.py),
without a fabric: CRC check values, the kernel's jhash against a C transcription of
include/linux/jhash.h and lookup3's published answers, invariants of the path index,
and the guided sweep's N probes / fallback. The rig test (test_hashmodel_rig.py) checks
the model against the kernel's own nft jhash."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from probing.budget import expected_probes
from probing.guided import guided_sweep
from probing.hashmodel import (
    HashModel,
    Tiers,
    crc16_ccitt,
    crc32,
    jhash,
    reciprocal_scale,
)
from transport.roce import ROCE_SPORTS

REPO = Path(__file__).resolve().parent.parent
SRC, DST = "10.2.0.2", "10.2.1.2"

models = st.builds(HashModel, function=st.sampled_from(["jhash", "crc32", "crc16-ccitt"]),
                   seed=st.integers(0, 2**32 - 1),
                   fields=st.permutations(["src", "dst", "proto", "sport", "dport"]).flatmap(
                       lambda p: st.integers(1, 5).map(lambda k: tuple(p[:k]))),
                   select=st.sampled_from(["modulo", "reciprocal"]))


def test_crc_check_values() -> None:
    assert crc32(b"123456789") == 0xCBF43926  # CRC-32/ISO-HDLC
    assert crc16_ccitt(b"123456789", 0xFFFF) == 0x29B1  # CRC-16/CCITT-FALSE
    assert crc16_ccitt(b"123456789", 0) == 0x31C3  # CRC-16/XMODEM
    assert crc32(b"") == 0 and crc16_ccitt(b"", 0x1D0F) == 0x1D0F


def test_jhash_known_answers() -> None:
    # lookup3.c's driver: hashlittle() is the kernel's jhash() on a little-endian CPU
    four_score = b"Four score and seven years ago"
    assert jhash(four_score, 0) == 0x17770551
    assert jhash(four_score, 1) == 0xCD628161
    assert jhash(b"", 0) == 0xDEADBEEF  # case 0: no final mix


@pytest.mark.skipif(sys.byteorder != "little", reason="the kernel's jhash loads CPU-order words")
def test_jhash_matches_the_c_transcription(tmp_path: Path) -> None:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not found: compiles tests/c/jhash_ref.c")
    exe = tmp_path / "jhash_ref"
    build = subprocess.run([gcc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-O2",
                            str(REPO / "tests" / "c" / "jhash_ref.c"), "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    rng = random.Random(7)
    # every tail length 0..12 over 0..3 full blocks, and the rig's 16-byte nft key
    cases = [(rng.randbytes(n), rng.getrandbits(32)) for n in range(0, 49) for _ in range(8)]
    cases += [(HashModel(seed=s).key(SRC, DST, p), s) for s, p in
              ((rng.getrandbits(32), rng.randrange(0xC000, 0x10000)) for _ in range(200))]
    stdin = "".join(f"{k.hex() or '-'} {s}\n" for k, s in cases)
    run = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True)
    got = [int(x, 16) for x in run.stdout.split()]
    assert got == [jhash(k, s) for k, s in cases]


def test_nft_key_layout() -> None:
    # each field in a 32-bit register, network byte order, zero-padded; alone: unpadded
    m = HashModel("jhash", 0, ("src", "dst", "sport", "dport"))
    assert m.key(SRC, DST, 0xC001, 4791).hex() == "0a0200020a020102c001000012b70000"
    assert HashModel(fields=("proto", "sport")).key(SRC, DST, 0xC001).hex() == "11000000c0010000"
    assert HashModel(fields=("sport",)).key(SRC, DST, 0xC001).hex() == "c001"
    # switch-style CRC keys are packed
    crc = HashModel("crc32", 0, ("src", "dst", "proto", "sport", "dport"), "modulo")
    assert crc.key(SRC, DST, 0xC001).hex() == "0a0200020a02010211c00112b7"


def test_selection() -> None:
    assert reciprocal_scale(0xFFFFFFFF, 4) == 3 and reciprocal_scale(0x3FFFFFFF, 4) == 0
    m = HashModel("crc32", 0, ("sport",), "modulo")
    assert m.path_of(SRC, DST, 0xC000, n=7) == crc32((0xC000).to_bytes(2, "big")) % 7
    with pytest.raises(ValueError):
        HashModel("md5")
    with pytest.raises(ValueError):
        HashModel(fields=("sport", "sport"))
    with pytest.raises(ValueError):
        m.path_of(SRC, DST, 1, n=0)


@given(models, st.integers(1, 64), st.integers(0, 65535), st.integers(0, 2**32 - 1))
def test_path_in_range_and_deterministic(m: HashModel, n: int, sport: int, dst: int) -> None:
    i = m.path_of(SRC, dst, sport, n=n)
    assert 0 <= i < n and i == m.path_of(SRC, dst, sport, n=n)


@given(models, st.integers(1, 16), st.integers(0, 2**32 - 1))
def test_ports_per_path_maps_each_port_to_its_index(m: HashModel, n: int, dst: int) -> None:
    got = m.ports_per_path(SRC, dst, n, range(0xC000, 0xC000 + 512))
    assert all(m.path_of(SRC, dst, port, n=n) == i for i, port in got.items())
    # the first port in order that maps there
    for i, port in got.items():
        assert all(m.path_of(SRC, dst, q, n=n) != i for q in range(0xC000, port))


@pytest.mark.parametrize("function,select", [("jhash", "reciprocal"), ("crc32", "modulo"),
                                             ("crc16-ccitt", "modulo")])
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_roughly_uniform_over_the_roce_ports(function: str, select: str, n: int) -> None:
    m = HashModel(function, 0x5EED, select=select)
    counts = [0] * n
    for port in ROCE_SPORTS:
        counts[m.path_of(SRC, DST, port, n=n)] += 1
    mean = len(ROCE_SPORTS) / n
    chi2 = sum((c - mean) ** 2 / mean for c in counts)
    # chi-square with n-1 d.o.f.: mean n-1; a bound far in the tail (a linear CRC over
    # consecutive ports is *more* even than random, which passes too)
    assert chi2 < 5 * n + 20, (counts, chi2)


def test_tiers_compose_and_polarise() -> None:
    leaf, spine = HashModel(seed=1), HashModel(seed=2)
    t = Tiers(((leaf, 2), (spine, 3)))
    assert t.n == 6
    for port in range(0xC000, 0xC040):
        i0, i1 = t.choices(SRC, DST, port)
        assert t.path_of(SRC, DST, port) == i0 * 3 + i1
    assert len(t.ports_per_path(SRC, DST, 6)) == 6
    # the same hash at both tiers: tier 2's choice follows tier 1's, half the paths unused
    same = Tiers(((leaf, 2), (leaf, 2)))
    assert sorted(same.ports_per_path(SRC, DST, 4)) == [0, 3]
    with pytest.raises(ValueError):
        t.ports_per_path(SRC, DST, 5)


class ModelProber:
    """A fabric whose path is `truth`'s index; `silent` ports never answer."""

    def __init__(self, truth: HashModel, n: int, silent: frozenset[int] = frozenset()) -> None:
        self.truth, self.n, self.silent = truth, n, silent
        self.probed: list[int] = []

    def trace(self, sport: int) -> tuple[str, ...] | None:
        self.probed.append(sport)
        if sport in self.silent:
            return None
        return (f"p{self.truth.path_of(SRC, DST, sport, n=self.n)}",)


@pytest.mark.parametrize("n", [2, 4, 8, 32])
def test_guided_sweep_uses_n_probes_with_the_right_model(n: int) -> None:
    m = HashModel(seed=99)
    prober = ModelProber(m, n)
    r = guided_sweep(prober, m, DST, SRC, n)
    assert (r.stopped, r.probes_sent, len(r.paths)) == ("model", n, n)
    assert sorted(prober.probed) == sorted(m.ports_per_path(SRC, DST, n).values())


def test_guided_sweep_falls_back_on_a_wrong_model() -> None:
    n = 8
    prober = ModelProber(HashModel(seed=1), n)
    r = guided_sweep(prober, HashModel(seed=2), DST, SRC, n, expected=n)
    assert r.stopped == "model-mismatch:expected" and len(r.paths) == n
    assert len(prober.probed) == len(set(prober.probed)) == r.probes_sent  # none re-sent
    assert r.probes_sent < 4 * expected_probes(n)
    quiet = guided_sweep(ModelProber(HashModel(seed=1), n), HashModel(seed=2), DST, SRC, n)
    assert quiet.stopped == "model-mismatch:quiet" and len(quiet.paths) == n


def test_guided_sweep_with_a_silent_port_finishes_blind() -> None:
    m, n = HashModel(seed=3), 4
    first = m.ports_per_path(SRC, DST, n)[2]
    prober = ModelProber(m, n, silent=frozenset({first}))
    r = guided_sweep(prober, m, DST, SRC, n, expected=n)
    assert r.stopped == "model-incomplete:expected" and len(r.paths) == n
    assert r.unanswered == 1 and prober.probed.count(first) == 1


def test_guided_sweep_paces_real_probes_only() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    n = 4
    prober = ModelProber(HashModel(seed=1), n)
    r = guided_sweep(prober, HashModel(seed=2), DST, SRC, n, expected=n, rate_pps=100,
                     clock=lambda: now[0], sleep=sleep)
    # one interval between consecutive real probes, none for the replayed ones
    assert now[0] == pytest.approx((r.probes_sent - 1) * 0.01)
