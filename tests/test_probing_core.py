"""The sweep's pure parts: the coupon-collector budget, the sweep's stopping rules
against a hash-model prober, and ICMP decoding (golden bytes; garbage never raises)."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from probing.budget import expected_probes, harmonic, probes_for_all, quiet_probes
from probing.icmp import parse_reply
from probing.sweep import sweep
from transport.roce import ROCE_SPORTS


class HashProber:
    """Port -> one of n paths by a seeded hash, as a switch's ECMP would."""

    def __init__(self, n: int, seed: int = 0, silent: frozenset[int] = frozenset()) -> None:
        self.n, self.seed, self.silent = n, seed, silent
        self.sent = 0

    def trace(self, sport: int) -> tuple[str, ...] | None:
        self.sent += 1
        if sport in self.silent:
            return None
        return ("leaf", f"spine{random.Random(sport * 7919 + self.seed).randrange(self.n)}")


def test_budget_numbers() -> None:
    assert harmonic(1) == 1.0 and expected_probes(4) == pytest.approx(4 * (1 + 1/2 + 1/3 + 1/4))
    assert quiet_probes(1, 0.5) == 1 and quiet_probes(4, 1e-3) == 31
    assert probes_for_all(1) == 1
    assert 4 * (1 - 1 / 4) ** probes_for_all(4, 1e-3) <= 1e-3
    with pytest.raises(ValueError):
        quiet_probes(3, 0.0)


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 64])
def test_sweep_with_known_count_finds_every_path(n: int) -> None:
    prober = HashProber(n, seed=n)
    r = sweep(prober, "peer", ROCE_SPORTS, expected=n, max_probes=100_000)
    assert r.stopped == "expected" and len(r.paths) == n
    assert r.probes_sent == prober.sent
    assert sorted({h[1] for h in r.paths}) == sorted({f"spine{i}" for i in range(n)})


@pytest.mark.parametrize("n", [2, 4, 8])
def test_sweep_without_a_count_stops_quietly_having_found_all(n: int) -> None:
    r = sweep(HashProber(n, seed=3), "peer", ROCE_SPORTS, miss=1e-4)
    assert r.stopped == "quiet" and len(r.paths) == n


def test_budget_and_silence_are_respected() -> None:
    silent = frozenset(range(0xC000, 0xC010))
    r = sweep(HashProber(8, silent=silent), "peer", ROCE_SPORTS, expected=8, max_probes=20)
    assert r.stopped == "budget" and r.probes_sent == 20 and r.unanswered == 16
    r = sweep(HashProber(2), "peer", ROCE_SPORTS, expected=2, ports_per_path=3)
    assert all(len(p) == 3 for p in r.paths.values())
    # nothing answers at all: give up early instead of waiting out every timeout
    r = sweep(HashProber(8, silent=frozenset(ROCE_SPORTS)), "peer", ROCE_SPORTS, give_up=10)
    assert (r.stopped, r.probes_sent, r.paths) == ("unanswered", 10, {})
    # once a path answered, silent ports are only unanswered probes
    r = sweep(HashProber(2, silent=silent), "peer", [0xD000, *silent, 0xD001], give_up=4)
    assert r.stopped != "unanswered" and r.unanswered == 16


def test_pacing_uses_the_injected_clock() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(d: float) -> None:
        slept.append(d)
        now[0] += d

    sweep(HashProber(2), "peer", ROCE_SPORTS, expected=2, rate_pps=100.0,
          clock=lambda: now[0], sleep=sleep)
    assert slept and all(d == pytest.approx(0.01) for d in slept)


def _ipv4(src: bytes, dst: bytes, proto: int, payload: bytes, ttl: int = 64) -> bytes:
    head = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0, ttl, proto, 0,
                       src, dst)
    return head + payload


def test_golden_time_exceeded_and_port_unreachable() -> None:
    probe = _ipv4(bytes([10, 2, 0, 2]), bytes([10, 2, 1, 2]), 17,
                  struct.pack("!HHHH", 0xC00F, 4791, 18, 0) + b"crux-probe", ttl=1)
    te = _ipv4(bytes([10, 3, 1, 2]), bytes([10, 2, 0, 2]), 1,
               bytes([11, 0, 0, 0, 0, 0, 0, 0]) + probe[:28])
    r = parse_reply(te)
    assert r is not None and r.expired and not r.reached
    assert (r.responder, r.dst, r.sport, r.dport, r.ttl_left) == (
        "10.3.1.2", "10.2.1.2", 0xC00F, 4791, 1)
    pu = _ipv4(bytes([10, 2, 1, 2]), bytes([10, 2, 0, 2]), 1,
               bytes([3, 3, 0, 0, 0, 0, 0, 0]) + probe[:28])
    r = parse_reply(pu)
    assert r is not None and r.reached and r.responder == "10.2.1.2"
    echo = _ipv4(bytes([10, 2, 1, 2]), bytes([10, 2, 0, 2]), 1,
                 bytes([0, 0, 0, 0, 0, 0, 0, 0]) + probe[:28])
    assert parse_reply(echo) is None  # an echo reply is not an answer to a probe
    tcp = bytearray(te)
    tcp[20 + 8 + 9] = 6
    assert parse_reply(bytes(tcp)) is None  # quoting a non-UDP packet
    assert parse_reply(te[:40]) is None  # truncated quote


@given(st.binary(max_size=200))
def test_any_bytes_never_raise(data: bytes) -> None:
    r = parse_reply(data)
    assert r is None or (0 <= r.sport <= 65535 and r.type in (3, 11))
