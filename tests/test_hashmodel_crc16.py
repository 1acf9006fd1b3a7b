"""probing.hashmodel's CRC-16-CCITT is the standard library's binascii.crc_hqx, and that is
the CRC a switch computes: checked against a bitwise transcription of the definition."""

from __future__ import annotations

import binascii

import pytest
from hypothesis import given
from hypothesis import strategies as st

from probing import hashmodel
from probing.hashmodel import HashModel, crc16_ccitt


def _crc16_bitwise(data: bytes, seed: int) -> int:
    """The definition: polynomial 0x1021, MSB first, no reflection, no final xor."""
    crc = seed & 0xFFFF
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def test_reference_check_values() -> None:
    assert _crc16_bitwise(b"123456789", 0xFFFF) == 0x29B1  # CRC-16/CCITT-FALSE
    assert _crc16_bitwise(b"123456789", 0) == 0x31C3  # CRC-16/XMODEM


@given(st.binary(max_size=64), st.integers(0, 2**32 - 1))
def test_crc16_ccitt_matches_the_bitwise_definition(data: bytes, seed: int) -> None:
    assert crc16_ccitt(data, seed) == _crc16_bitwise(data, seed)


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 0xFFFF),
       st.integers(0, 0xFFFF))
def test_models_hash_with_the_same_crc(src: int, dst: int, sport: int, seed: int) -> None:
    m = HashModel("crc16-ccitt", seed, ("src", "dst", "proto", "sport", "dport"), "modulo")
    assert m.hash(src, dst, sport) == _crc16_bitwise(m.key(src, dst, sport), seed)


def test_the_crc_is_the_standard_librarys(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, int]] = []
    real = binascii.crc_hqx

    def spy(data: bytes, value: int) -> int:
        calls.append((bytes(data), value))
        return real(data, value)
    monkeypatch.setattr(hashmodel.binascii, "crc_hqx", spy)
    assert crc16_ccitt(b"123456789", 0x1FFFF) == 0x29B1
    assert calls == [(b"123456789", 0xFFFF)]
