"""Shared pieces of the fuzz tests (test_fuzz_*.py): the example budget, the allocation
bound, and strategies that mutate valid encodings.

CI runs a small budget; CRUX_FUZZ_EXAMPLES=5000 raises every fuzz test's max_examples.
"""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("CRUX_FUZZ_EXAMPLES", "0"))
MAX_PEAK = 8 << 20  # bytes a parser may allocate for one input of at most a few KiB


def budget(n: int) -> Callable[[Any], Any]:
    return settings(max_examples=EXAMPLES or n, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


@contextmanager
def bounded(limit: int = MAX_PEAK) -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
        assert peak < limit, f"peak allocation {peak} bytes"
    finally:
        tracemalloc.stop()


def mutate(data: bytes, draw: st.DrawFn) -> bytes:
    """Overwrite, truncate or extend a valid encoding."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(0, 8))):
        if buf:
            buf[draw(st.integers(0, len(buf) - 1))] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(buf)))
    return bytes(buf[:cut]) + draw(st.binary(max_size=16)) if draw(st.booleans()) else bytes(buf)


def variant(draw: st.DrawFn, valid: bytes, max_random: int) -> bytes:
    """The valid encoding itself, random bytes, or the valid encoding mutated."""
    kind = draw(st.sampled_from(("valid", "random", "mutated")))
    if kind == "valid":
        return valid
    return draw(st.binary(max_size=max_random)) if kind == "random" else mutate(valid, draw)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4), max_leaves=20)
