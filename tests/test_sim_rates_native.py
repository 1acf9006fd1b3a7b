"""The C rate solver (shim/sim/crux_rates.c) against the numpy reference: the same
doubles, bit for bit, so simulator results do not depend on which one ran."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from cruxd.sim.rates import allocate, allocate_numpy, solver


def test_the_install_built_the_c_solver() -> None:
    # pip install (and `python setup.py build_ext --inplace`) compile it; the simulator's
    # speed depends on it, so a missing library is an install fault, not a skip
    assert solver().startswith("C"), solver()


@st.composite
def problems(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = draw(st.integers(0, 12))
    links = draw(st.integers(1, 30))
    values = st.one_of(st.just(0.0), st.sampled_from([1.0, 2.0, 0.5, 3.0]),
                       st.floats(1e-3, 50.0))
    weights = draw(arrays(np.float64, (n, links), elements=values))
    cap = draw(arrays(np.float64, (links,), elements=st.floats(0.1, 1e3)))
    level = draw(arrays(np.int64, (n,), elements=st.integers(0, 3)))
    return weights, cap, level


@settings(max_examples=1000)
@given(problems())
# one link and 8 entities: numpy's ndarray.sum adds a contiguous axis pairwise, which
# the reference once did here (CI found it); it adds in entity order now
@example((np.full((8, 1), 0.1), np.array([0.1]), np.zeros(8, dtype=np.int64)))
def test_c_and_numpy_give_the_same_doubles(case: tuple) -> None:  # type: ignore[type-arg]
    weights, cap, level = case
    assert np.array_equal(allocate(weights, cap, level), allocate_numpy(weights, cap, level))


def test_edges() -> None:
    none = allocate(np.zeros((0, 3)), np.ones(3), np.zeros(0, dtype=np.int64))
    assert none.shape == (0,)
    # no link: unlimited; weights too small to fill a link: unlimited too (the reference
    # once looped for ever on those)
    w = np.array([[0.0, 0.0], [1e-14, 0.0], [1.0, 1.0]])
    for fn in (allocate, allocate_numpy):
        assert fn(w, np.array([4.0, 2.0]), np.array([0, 0, 0])).tolist() == [
            np.inf, np.inf, 2.0]
    # a NaN level is never served (the C solver once looped for ever on it)
    for fn in (allocate, allocate_numpy):
        assert fn(np.ones((2, 1)), np.array([4.0]), np.array([np.nan, 0.0])).tolist() == [
            0.0, 4.0]
    # levels given as floats, and a transposed (non-contiguous) weight matrix
    wt = np.asfortranarray(np.array([[1.0, 1.0], [1.0, 0.0]]))
    assert allocate(wt, np.array([10.0, 4.0]), np.array([1.0, 0.0])).tolist() == [4.0, 6.0]


def test_mismatched_shapes_are_refused_before_c_reads_them() -> None:
    with pytest.raises(ValueError, match="capacity"):
        allocate(np.ones((2, 3)), np.ones(2), np.zeros(2))
    with pytest.raises(ValueError, match="level"):
        allocate(np.ones((2, 3)), np.ones(3), np.zeros(3))
